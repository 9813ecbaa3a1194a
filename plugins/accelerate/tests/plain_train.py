"""An Accelerate training script that knows nothing of core_ops (test_launches.py runs it
under `accelerate launch`, the plugin switched on by the environment alone). Saves what
it saw to OUT/plain-rank<r>.pt."""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator

sys.path.insert(0, str(Path(__file__).parents[3] / "tests" / "support"))
import small_task as task  # noqa: E402


def main(out):
    accelerator = Accelerator()
    model = task.conv_net(accelerator.process_index)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, opt, loader = accelerator.prepare(model, opt, task.loader())
    losses = []
    for _ in range(3):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss))
    inner = accelerator.unwrap_model(model)
    torch.save(dict(wrapper=f"{type(model).__module__}.{type(model).__name__}",
                    optimizer=type(opt.optimizer).__name__, losses=losses,
                    dtypes=sorted({str(p.dtype) for p in inner.parameters()}),
                    bn=sorted({type(m).__name__ for m in inner.modules() if "BatchNorm" in type(m).__name__}),
                    params=task.flat(inner.parameters())),
               Path(out) / f"plain-rank{accelerator.process_index}.pt")


if __name__ == "__main__":
    main(sys.argv[1])
