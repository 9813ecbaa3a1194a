"""Shared benchmark harness: timing, A/B comparison tables, CLI, plot and JSON output.

Timings are wall-clock per call in ms. On CUDA the device is synchronized before and
after each call, so a time covers the kernels the call launched, not just the launch.
"""

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import time

import torch
import torch.multiprocessing


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _time_once(fn, device, before=None):
    if before is not None:
        before()  # untimed set-up, e.g. fresh grads as backward would leave them
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return (time.perf_counter() - t0) * 1e3


def summarize(times_ms):
    """(median, IQR) of a list of times; IQR is the spread that ignores outliers."""
    q1, med, q3 = statistics.quantiles(times_ms, n=4, method="inclusive")
    return med, q3 - q1


def time_fn(fn, device="cpu", repeats=30, warmup=3):
    """Times of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    return [_time_once(fn, device) for _ in range(repeats)]


def time_ab(baseline, candidate, device="cpu", repeats=30, warmup=3, before=None):
    """Times of two callables run alternately (ABAB...), so that noise from other
    jobs on the machine, frequency changes and the like hit both about equally
    instead of landing on whichever happened to run during a busy spell. ``before``,
    if given, runs untimed before every call of either."""
    for _ in range(warmup):
        baseline()
        candidate()
    a, b = [], []
    for _ in range(repeats):
        a.append(_time_once(baseline, device, before))
        b.append(_time_once(candidate, device, before))
    return a, b


def row(case, baseline_name, base_times, core_times, target=None, **extra):
    """One comparison result; ``target`` is the largest acceptable core/baseline ratio."""
    bmed, biqr = summarize(base_times)
    cmed, ciqr = summarize(core_times)
    ratio = cmed / bmed
    passed = None if target is None else ratio <= target
    return dict(case=case, baseline=baseline_name, baseline_ms=bmed, baseline_iqr_ms=biqr,
                core_ops_ms=cmed, core_ops_iqr_ms=ciqr, ratio=ratio, target=target,
                passed=passed, baseline_times_ms=base_times, core_ops_times_ms=core_times,
                **extra)


def compare(rows):
    """Prints the rows as a markdown table (medians with IQR in parentheses)."""
    print("| case | baseline | baseline median ms | core_ops median ms "
          "| ratio (core_ops / baseline) | target | pass/fail |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        target = "-" if r["target"] is None else f"<= {r['target']:g}"
        verdict = "-" if r["passed"] is None else ("pass" if r["passed"] else "FAIL")
        print(f"| {r['case']} | `{r['baseline']}` "
              f"| {r['baseline_ms']:.2f} (IQR {r['baseline_iqr_ms']:.2f}) "
              f"| {r['core_ops_ms']:.2f} (IQR {r['core_ops_iqr_ms']:.2f}) "
              f"| {r['ratio']:.2f} | {target} | {verdict} |")


def copy_bandwidth(device="cpu", numel=64 * 2**20, repeats=20):
    """This machine's copy bandwidth in GB/s: median of ``dst.copy_(src)`` on a fp32
    buffer (256 MB by default, well past any cache), counting bytes read + written.
    On CPU the copy also reads every ``dst`` line before writing it (write-allocate),
    traffic not counted here; an in-place op has no such read, so it can beat 100%."""
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    med, _ = summarize(time_fn(lambda: dst.copy_(src), device, repeats))
    return 2 * src.numel() * src.element_size() / (med * 1e-3) / 1e9


def gbps(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9


def parser(description, numel=20_000_000, tensors=200, repeats=30):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--repeats", type=int, default=repeats, help="timed calls per side")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--numel", type=int, default=numel, help="total elements over all tensors")
    p.add_argument("--tensors", type=int, default=tensors, help="number of tensors")
    p.add_argument("--threads", type=int, help="CPU threads (torch.set_num_threads); 1 gives "
                   "steadier numbers on a machine busy with other jobs")
    p.add_argument("--plot", metavar="PATH", help="write a PNG bar chart of the ratios")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    return p


def setup(args):
    """Applies the common args that change the process: device check, thread count."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available here")
    if args.threads:
        torch.set_num_threads(args.threads)


def machine():
    return dict(torch=torch.__version__, python=platform.python_version(),
                cpu=platform.processor() or platform.machine(),
                cpu_capability=torch.backends.cpu.get_cpu_capability(),
                threads=torch.get_num_threads(),
                gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)


def plot(rows, path, title=""):
    try:
        import matplotlib
    except ImportError:
        print(f"--plot: matplotlib is not installed, so {path} was not written "
              "(pip install matplotlib)")
        return
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4))
    ratios = [r["ratio"] for r in rows]
    colors = ["tab:red" if r["passed"] is False else "tab:blue" for r in rows]
    ax.bar(range(len(rows)), ratios, color=colors)
    for i, r in enumerate(rows):
        if r["target"] is not None:
            ax.hlines(r["target"], i - 0.4, i + 0.4, colors="black", linestyles="dashed")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(range(len(rows)), [r["case"] for r in rows], rotation=30, ha="right")
    ax.set_ylabel("core_ops / baseline median time")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def write_json(path, rows, **meta):
    with open(path, "w") as f:
        json.dump(dict(machine=machine(), **meta, rows=rows), f, indent=2)
    print(f"wrote {path}")


def run_ranks(worker, args, world_size=2, timeout_s=300, backend="gloo"):
    """Runs ``worker(rank, args)`` in ``world_size`` spawned processes joined in one
    process group on loopback, each with ``args.threads`` threads (default 1); the group
    is torn down after. ``backend="nccl"``: rank r on GPU r. ``worker`` must be a
    module-level function (spawn pickles it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_rank, args=(worker, args, world_size, port, timeout_s, backend),
                                nprocs=world_size, join=True)


def _rank(rank, worker, args, world_size, port, timeout_s, backend):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads or 1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        worker(rank, args)
    finally:
        dist.destroy_process_group()


def emit_row(row):
    """Prints ``row``'s numbers for the parent of a launched child (``child_row``)."""
    print("ROW " + json.dumps({k: row[k] for k in ("baseline_ms", "baseline_iqr_ms", "core_ops_ms",
                                                    "core_ops_iqr_ms", "ratio")}))


def child_row(cmd, env, case, baseline, target):
    """Runs ``cmd`` (a launcher starting a multi-process case that ``emit_row``s on rank
    0) and returns its row."""
    import subprocess
    child = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = next((ln for ln in child.stdout.splitlines() if ln.startswith("ROW ")), None)
    if line is None:
        raise SystemExit(f"{case}: the launched case failed:\n" + child.stdout[-2000:] + child.stderr[-4000:])
    r = json.loads(line[4:])
    return dict(case=case, baseline=baseline, target=target, passed=r["ratio"] <= target, **r)


def report(rows, args):
    """The comparison table, and the JSON file when ``--json`` was given."""
    compare(rows)
    if args.json:
        write_json(args.json, rows, args=vars(args))


def framework_main(doc, case_one, case_ddp, launcher, env, ddp_case, ddp_baseline, warmup):
    """``main()`` of a framework's bench (bench_lightning, bench_accelerate): the
    one-process case here, then the 2-rank case in a child that ``launcher`` (the command
    before this file) starts with ``--case ddp`` and that ``emit_row``s on rank 0."""
    import sys
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="alternations of the two runs")
    p.add_argument("--steps", type=int, default=40, help="steps per run")
    p.add_argument("--case", choices=["all", "ddp"], default="all")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.case == "ddp":
        case_ddp(args)
        return
    rows = [case_one(args)]
    child = [*launcher, sys.argv[0], "--case", "ddp", "--repeats", str(args.repeats), "--steps", str(args.steps)]
    rows.append(child_row(child, dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **env), ddp_case,
                          ddp_baseline, 1.0))
    print(f"one thread per process, {args.repeats} alternations x {args.steps} steps "
          f"({warmup} warm-up steps left out of each)\n")
    compare(rows)
