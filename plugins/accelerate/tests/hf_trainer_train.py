"""A Hugging Face Trainer script as users write it, with no core-ops in it: a tiny
GPT-2 built here (no download), three steps on the CPU, then one line that says what
the Trainer stepped (test_hf_trainer.py sets the CORE_OPS_* variables)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32))
data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(8)]
args = TrainingArguments("out", per_device_train_batch_size=4, max_steps=3, report_to=[], use_cpu=True,
                         save_strategy="no", disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=data)
trainer.train()
opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
print("stepped", type(opt).__name__, getattr(opt, "master_weights", None), next(model.parameters()).dtype,
      opt.param_groups[0]["lr"] == trainer.lr_scheduler.get_last_lr()[0])
