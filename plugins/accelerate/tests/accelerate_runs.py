"""Real 2-process runs of the Accelerate plugin (CPU, gloo), one launch per suite:

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 accelerate_runs.py suite OUT

Every rank saves its results to OUT/suite-rank<r>.pt for test_launches.py. Ranks build
their models from different seeds: the broadcast of core_ops' DDP must make them one.
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator

sys.path.insert(0, str(Path(__file__).parents[3] / "tests" / "support"))
import small_task as task  # noqa: E402
from teardown import leave_process_group  # noqa: E402

from core_ops_accelerate import ApexPlugin  # noqa: E402


def train(accelerator, model, opt, batches, sched=None, inf_at=None, record=None, clip=None):
    rank = accelerator.process_index
    for i, (x, y) in enumerate(batches):
        with accelerator.accumulate(model):
            loss = F.cross_entropy(model(x), y)
            if inf_at == (i, rank):
                loss = loss * float("inf")
            accelerator.backward(loss)
            norm = accelerator.clip_grad_norm_(model.parameters(), clip) if clip else None
            opt.step()
            if sched is not None:
                sched.step()
            opt.zero_grad()
        if record is not None and accelerator.sync_gradients:
            record.append(dict(params=task.flat(model.parameters()), skipped=accelerator.optimizer_step_was_skipped,
                               lr=opt.param_groups[0]["lr"], norm=None if norm is None else float(norm)))


def setup(accelerator, seed, data=None, scheduler=False, lr=0.05):
    model = task.conv_net(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    objects = [model, opt, data or task.loader()]
    if scheduler:
        objects.append(torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9))
    return accelerator.prepare(*objects)


def suite(out):
    results = {}
    acc = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O2", sync_bn=True)])
    rank = acc.process_index
    results["rank"] = rank
    # O2 + SyncBN + clipping, rank 1's loss inf at step 2: both ranks skip it and the schedule.
    model, opt, dl, sched = setup(acc, 10 + rank, scheduler=True)
    record = []
    train(acc, model, opt, dl, sched, inf_at=(2, 1), record=record, clip=0.5)
    results["o2"] = dict(steps=record, model=type(model).__module__ + "." + type(model).__name__,
                         dtypes=sorted({str(p.dtype) for p in model.parameters()}),
                         bn=sorted({type(m).__name__ for m in model.modules() if "BatchNorm" in type(m).__name__}))
    # O0 + SyncBN on dealt half batches: the test compares with one process.
    acc0 = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O0", sync_bn=True)])
    ds = task.dataset()
    dealt = torch.utils.data.DataLoader(ds, batch_size=16, sampler=torch.utils.data.DistributedSampler(
        ds, num_replicas=2, rank=rank, shuffle=False))
    model0 = task.conv_net(0)
    opt0 = torch.optim.SGD(model0.parameters(), lr=0.05, momentum=0.9)
    model0, opt0 = acc0.prepare(model0, opt0)  # the dealt loader is left as it is
    train(acc0, model0, opt0, dealt)
    results["o0_syncbn"] = task.flat(model0.parameters())
    # Accumulation: 2 micro-batches a step, no collective on the first.
    acc_a = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O2", half_dtype="bf16")])
    acc_a.gradient_accumulation_steps = 2
    model_a, opt_a, dl_a = setup(acc_a, 10 + rank)
    counts = []
    with task.AllReduceCounter() as counter:
        for x, y in dl_a:
            before = counter.count
            with acc_a.accumulate(model_a):
                acc_a.backward(F.cross_entropy(model_a(x), y))
                opt_a.step()
                opt_a.zero_grad()
            counts.append(counter.count - before)
    acc_a.gradient_accumulation_steps = 1
    results["collectives"] = counts
    # save_state -> load_state continues exactly as the uninterrupted run.
    # (An Accelerator saves every object it prepared: one each for the whole run, the
    # first half and the resumed second half.)
    batches = [b for b in task.loader()][rank::2] * 2
    acc_w = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O2")])
    whole, wopt, _, wsched = setup(acc_w, 20 + rank, scheduler=True)
    train(acc_w, whole, wopt, batches, wsched)
    acc_s = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O2")])
    first, fopt, _, fsched = setup(acc_s, 20 + rank, scheduler=True)
    train(acc_s, first, fopt, batches[:4], fsched)
    acc_s.save_state(str(Path(out) / "state"))
    acc_s2 = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O2")])
    resumed, ropt, _, rsched = setup(acc_s2, 77, scheduler=True)
    acc_s2.load_state(str(Path(out) / "state"))
    train(acc_s2, resumed, ropt, batches[4:], rsched)
    results["whole"], results["resumed"] = task.flat(whole.parameters()), task.flat(resumed.parameters())
    results["saved_dtypes"] = sorted({str(v.dtype) for v in acc_s2.get_state_dict(resumed).values()
                                      if v.is_floating_point()})
    return results


if __name__ == "__main__":
    name, out = sys.argv[1], sys.argv[2]
    results = suite(out)
    torch.save(results, Path(out) / f"{name}-rank{results['rank']}.pt")
    leave_process_group()
