"""core-ops' CPU optimizers against the CPU optimizers a user would pick instead (torch,
DeepSpeed, IPEX, bitsandbytes, torchao), each installed as a user would, in a venv of
its own, and run in a worker process of that venv; one markdown table.

    python bench/bench_cpu_optimizers.py                          # Adam family, 25,088,000 params
    python bench/bench_cpu_optimizers.py --family all --json cpu_optimizers.json
    python bench/bench_cpu_optimizers.py --numel 2000000 --tensors 20 --rounds 3   # a quick check
    python bench/bench_cpu_optimizers.py --only 'IPEX|core-ops FusedAdam fp32' --no-install

Venvs (``--cache-dir``, default ~/.cache/core-ops-bench, or $CORE_OPS_BENCH_CACHE):
  main   this interpreter's: torch, core-ops, DeepSpeed (its cpu_adam op builds at first use)
  ipex   torch 2.8 + intel-extension-for-pytorch 2.8 (PyPI's torch 2.8 is a CUDA build: ~7 GB)
  quant  torchao 0.18 + bitsandbytes 0.50, layered on main's site-packages (a .pth file), so
         it reuses main's torch; installed with --no-deps, so pip never touches main
A missing venv is made and installed (unless --no-install); a contestant whose venv or
package fails is printed as skipped, with the reason.

Every contestant gets the same ``--numel`` values in ``--tensors`` equal tensors (each
a multiple of 256), the same grads (randn * 1e-2, seed 0) and lr 1e-3, weight decay
0.01 (decoupled for Adam and LAMB, torch's L2 for SGD and Adagrad). Bfloat16
contestants get both rounded once to bfloat16.
  Time: the workers take turns, one ``opt.step()`` each per round (``--rounds``), the
    others waiting on a pipe, so no two share the cores; medians per contestant, and
    their ratio to core-ops fp32 of the same family.
  Update error: after 5 steps (grads g * (1, -0.5, 2, -1, 0.5)) from the same params,
    ||dp - dp_ref|| / ||dp_ref|| over all elements, dp_ref from a float64 run of
    torch.optim's AdamW / SGD / Adagrad (LAMB: cpu_contestants._lamb_step_), dp of the
    param as the model holds it (bfloat16 for bf16 rows), and of the fp32 master where
    there is one; and the share of elements that never moved.
  B/param: what persists between steps, measured from the objects (params, masters,
    remainders, trails, moments, block maxima; not step counts, shared maps or grads).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import harness
from cpu_contestants import FAMILIES, contestants, reference_delta

HERE = Path(__file__).resolve().parent
WORKER = HERE / "cpu_contestants.py"


@dataclass(frozen=True)
class Venv:
    name: str
    pins: tuple = ()
    overlay: bool = False  # layered on main's site-packages: reuses its torch


VENVS = {v.name: v for v in (
    Venv("main"),
    Venv("ipex", ("torch==2.8.*", "intel-extension-for-pytorch==2.8.*")),
    Venv("quant", ("torchao==0.18.*", "bitsandbytes==0.50.*"), overlay=True),
)}


# ---- venvs --------------------------------------------------------------------------

def _probe(python, pins):
    """{distribution: version} of torch and the pinned ones in ``python``'s venv, or
    raises CalledProcessError."""
    names = ["torch", *(re.split(r"[=<>]", pin)[0] for pin in pins)]
    code = ("import json, importlib.metadata as m\n"
            f"print(json.dumps({{n: m.version(n) for n in {names!r}}}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pins_met(versions, pins):
    for pin in pins:
        name, want = pin.split("==")
        if not versions.get(name, "").startswith(want.rstrip("*").rstrip(".")):
            return False
    return True


def _size_gb(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total / 1e9


def ensure_venv(venv, cache, install):
    """dict(python, versions, installed_s, size_gb) of a ready venv, or dict(skip=reason)."""
    if venv.name == "main":
        return dict(python=sys.executable, versions=_probe(sys.executable, ()), installed_s=None, size_gb=None)
    path = cache / venv.name
    python = path / "bin" / "python"
    if python.exists():
        try:
            versions = _probe(str(python), venv.pins)
            if _pins_met(versions, venv.pins):
                return dict(python=str(python), versions=versions, installed_s=None, size_gb=_size_gb(path))
        except subprocess.CalledProcessError:
            pass  # half installed: pip below completes it
    if not install:
        return dict(skip=f"venv {path} is missing or incomplete, and --no-install was given")
    print(f"installing venv {venv.name} ({', '.join(venv.pins)}) in {path}; log: {path}/install.log", flush=True)
    t0 = time.perf_counter()
    log = None
    try:
        if not python.exists():
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", str(path)], check=True, capture_output=True, text=True)
        if venv.overlay:
            purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     check=True, capture_output=True, text=True).stdout.strip()
            Path(purelib, "_core_ops_bench_main.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check",
               *(["--no-deps"] if venv.overlay else []), *venv.pins]
        with open(path / "install.log", "w") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
        versions = _probe(str(python), venv.pins)
    except (subprocess.CalledProcessError, OSError) as e:
        tail = (path / "install.log").read_text().strip().splitlines()[-3:] if log else [str(e)]
        return dict(skip=f"installing {', '.join(venv.pins)} failed: {' / '.join(tail)}")
    seconds = time.perf_counter() - t0
    print(f"  venv {venv.name} ready in {seconds:.0f} s", flush=True)
    return dict(python=str(python), versions=versions, installed_s=seconds, size_gb=_size_gb(path))


# ---- inputs -------------------------------------------------------------------------

def sizes_of(numel, tensors):
    """``tensors`` equal sizes, each a multiple of 256 (torchao keeps plain state for a
    tensor whose size is not one; IPEX's and amp's models hold rows of 256)."""
    each = -(-numel // tensors // 256) * 256
    return [each] * tensors


class Inputs:
    """The params, grads and fp64 reference deltas, as raw files in ``folder``: every
    worker reads the same bits whatever its torch (random streams may differ between
    versions)."""

    def __init__(self, folder):
        self.folder = folder
        self.made = {}

    def files(self, family, sizes):
        count = len(sizes)
        if count not in self.made:
            g = torch.Generator().manual_seed(0)
            total = sum(sizes)
            p0 = torch.randn(total, generator=g)
            g0 = torch.randn(total, generator=g) * 1e-2
            paths = (self.folder / f"params-{count}.bin", self.folder / f"grads-{count}.bin")
            p0.numpy().tofile(paths[0])
            g0.numpy().tofile(paths[1])
            self.made[count] = paths
        params, grads = self.made[count]
        ref = self.folder / f"reference-{family}-{count}.bin"
        if not ref.exists():
            total = sum(sizes)
            p0 = torch.from_file(str(params), size=total, dtype=torch.float32)
            g0 = torch.from_file(str(grads), size=total, dtype=torch.float32)
            reference_delta(family, p0, g0, sizes).numpy().tofile(ref)
        return dict(params=str(params), grads=str(grads), reference=str(ref))


# ---- workers ------------------------------------------------------------------------

class Remote:
    """One contestant's worker process (cpu_contestants.serve) in its venv."""

    def __init__(self, contestant, python, log_path, threads):
        self.contestant, self.log_path = contestant, log_path
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env, cwd=HERE)

    def call(self, **msg):
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self.proc.wait()
            tail = Path(self.log_path).read_text().strip().splitlines()[-1:] or ["(no output)"]
            return dict(ok=False, reason=f"worker exited with {self.proc.returncode}: {tail[0][:200]}")
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps(dict(cmd="quit")) + "\n")
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            self.proc.wait(timeout=60)
        self.log.close()


def run_family(family, rows, venvs, args, inputs, logs):
    """Sets up every contestant of ``family`` at each tensor count, then times them in
    turns; fills ``rows`` (label -> row) in place."""
    remotes = {}
    for c in (c for c in rows.values() if c["family"] == family and not c.get("skip")):
        remotes[c["label"]] = Remote(c["contestant"], venvs[c["venv"]]["python"],
                                     logs / f"{re.sub(r'[^A-Za-z0-9]+', '_', c['label'])}.log", args.threads)
    try:
        for count in args.tensors:
            sizes = sizes_of(args.numel, count)
            files = inputs.files(family, sizes)
            live = []
            for label, remote in remotes.items():
                row = rows[label]
                if row.get("skip"):
                    continue
                print(f"  {count} tensors: setting up {label} ...", end=" ", flush=True)
                reply = remote.call(cmd="setup", label=label, sizes=sizes, threads=args.threads,
                                    warmup=args.warmup, **files)
                if not reply["ok"]:
                    row["skip"] = reply["reason"]
                    print(f"skipped ({reply['reason']})", flush=True)
                    continue
                print(f"{reply['setup_s']:.1f} s", flush=True)
                row["runs"][count] = dict(reply, times_ms=[])
                live.append(label)
            for _ in range(args.rounds):
                for label in live:
                    if rows[label].get("skip"):
                        continue
                    reply = remotes[label].call(cmd="time", steps=1)
                    if not reply["ok"]:
                        rows[label]["skip"] = f"failed while timing: {reply['reason']}"
                        continue
                    rows[label]["runs"][count]["times_ms"] += reply["ms"]
        if family == "adam":
            probe = next((r for label, r in remotes.items() if rows[label]["venv"] == "ipex"), None)
            if probe is not None:
                reply = probe.call(cmd="decay_probe")
                return reply.get("probe") or dict(failed=reply.get("reason"))
    finally:
        for remote in remotes.values():
            remote.close()
    return None


# ---- report -------------------------------------------------------------------------

def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return harness.machine()["cpu"]


def _median(run):
    return statistics.median(run["times_ms"]) if run and run["times_ms"] else None


def table(family, rows, counts):
    ours = [r for r in rows if r["family"] == family]
    base = next((r for r in ours if r["baseline"] and not r.get("skip")), None)
    head = ["contestant", "venv", "B/param", *(f"{n} t ms" for n in counts),
            *(f"vs core-ops fp32, {n} t" for n in counts),
            f"update error after 5 steps ({counts[0]} t)", "never moved"]
    print("| " + " | ".join(head) + " |")
    print("|---|---|" + "---:|" * (len(head) - 2))
    for r in ours:
        if r.get("skip") and not r["runs"]:
            print(f"| {r['label']} | {r['venv']} | skipped: {r['skip']} |" + " - |" * (len(head) - 3))
            continue
        first = r["runs"].get(counts[0]) or next(iter(r["runs"].values()))
        ms = [_median(r["runs"].get(n)) for n in counts]
        base_ms = [_median(base["runs"].get(n)) if base else None for n in counts]
        ratios = [f"{m / b:.2f}" if m and b else "-" for m, b in zip(ms, base_ms)]
        error = f"{first['error']:.2e}"
        if first["master_error"] is not None:
            error += f" (master {first['master_error']:.2e})"
        label = r["label"] + (f" (failed later: {r['skip']})" if r.get("skip") else "")
        cells = [label, r["venv"], f"{first['bytes_per_param']:.2f}",
                 *(f"{m:.1f}" if m else "-" for m in ms), *ratios, error, f"{100 * first['never_moved']:.1f}%"]
        print("| " + " | ".join(cells) + " |")


def memory_table(family, rows, counts):
    """The rows with a memory model (cpu_contestants.MOVED): bytes moved per param, and
    each step's time against the time those bytes take at the bandwidth the core-ops
    fp32 step reaches in the same run (its 28 bytes a param over its median): 100%
    is a step as bound by memory as the fp32 one, less is time spent computing."""
    ours = [r for r in rows if r["family"] == family and r["contestant"].moved and r["runs"]]
    base = next((r for r in ours if r["baseline"]), None)
    if base is None:
        return
    head = ["contestant", "moved B/param", *(f"{n} t: at fp32's GB/s ms / step ms" for n in counts)]
    print(f"\nMemory model ({family}): bytes a step moves per param, and the time they take at the bandwidth "
          "of core-ops fp32's step in this run, against the step's own time\n")
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for r in ours:
        cells = [r["label"], f"{r['contestant'].moved:.2f}"]
        for n in counts:
            ms, base_ms = _median(r["runs"].get(n)), _median(base["runs"].get(n))
            if not (ms and base_ms):
                cells.append("-")
                continue
            limit = base_ms * r["contestant"].moved / base["contestant"].moved
            cells.append(f"{limit:.1f} / {ms:.1f} = {100 * limit / ms:.0f}%")
        print("| " + " | ".join(cells) + " |")


def print_probe(probe):
    print("\nIPEX decay probe (3 steps, lr 1e-2, weight decay 0.1; distance of the update from torch's "
          "AdamW and from torch's Adam with L2 decay, relative):\n")
    if "failed" in probe:
        print(f"failed: {probe['failed']}")
        return
    print("| optimizer given to ipex.optimize, dtype | vs AdamW | vs Adam (L2) | decay applied |")
    print("|---|---:|---:|---|")
    for name, r in probe.items():
        print(f"| {name} | {r['vs_adamw']:.2e} | {r['vs_adam_l2']:.2e} | {r['applies']} |")


def print_environment(rows, venvs, args):
    print(f"\nmachine: {cpu_model()}, {os.cpu_count()} cores, {args.threads} threads per worker; "
          f"{sum(sizes_of(args.numel, args.tensors[0])):,} params; {args.rounds} rounds of one step each, "
          f"after the 5 checked steps and {args.warmup} warm-up steps")
    for name, v in venvs.items():
        if "skip" in v:
            print(f"venv {name}: not available: {v['skip']}")
            continue
        used = sorted({f"{r['package']} {run['package_version']}" for r in rows.values() if r["venv"] == name
                       for run in r["runs"].values()})
        how = ("in use as is" if v["installed_s"] is None else f"installed in {v['installed_s']:.0f} s")
        size = "" if v["size_gb"] is None else f", {v['size_gb']:.1f} GB"
        print(f"venv {name}: {v['python']} ({how}{size}); torch {v['versions']['torch']}; ran {', '.join(used) or '-'}")
    notes = [(r["label"], r["note"]) for r in rows.values() if r["note"] and r["runs"]]
    if notes:
        print("\nnotes:")
        for label, note in notes:
            print(f"- {label}: {note}")


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=[*FAMILIES, "all"], default="adam")
    p.add_argument("--numel", type=int, default=25_088_000, help="elements over all tensors")
    p.add_argument("--tensors", type=int, nargs="+", default=[200, 2000], help="tensor counts, one column each")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch / OpenMP threads of every worker")
    p.add_argument("--rounds", type=int, default=25, help="timed steps per contestant, taken in turns")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after the checked ones")
    p.add_argument("--only", metavar="REGEX", help="only contestants whose label matches")
    p.add_argument("--cache-dir", type=Path,
                   default=Path(os.environ.get("CORE_OPS_BENCH_CACHE", Path.home() / ".cache" / "core-ops-bench")))
    p.add_argument("--no-install", action="store_true", help="skip contestants whose venv is not ready")
    p.add_argument("--json", metavar="PATH", help="write every number, raw times included")
    return p.parse_args()


def main():
    args = parse()
    torch.set_num_threads(args.threads)
    families = FAMILIES if args.family == "all" else (args.family,)
    chosen = [c for c in contestants() if c.family in families and (not args.only or re.search(args.only, c.label))]
    if not chosen:
        raise SystemExit("no contestant matches --family / --only")
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    venvs = {name: ensure_venv(VENVS[name], args.cache_dir, not args.no_install)
             for name in dict.fromkeys(c.venv for c in chosen)}
    rows = {c.label: dict(label=c.label, family=c.family, venv=c.venv, package=c.package, baseline=c.baseline,
                          note=c.note, contestant=c, runs={}, skip=venvs[c.venv].get("skip"))
            for c in chosen}
    work = Path(tempfile.mkdtemp(prefix="core-ops-bench-"))
    probe = None
    try:
        inputs = Inputs(work)
        for family in families:
            print(f"{family}: {len([r for r in rows.values() if r['family'] == family])} contestants", flush=True)
            probe = run_family(family, rows, venvs, args, inputs, work) or probe
    except BaseException:
        print(f"worker logs kept in {work}", file=sys.stderr)
        raise
    for family in families:
        print(f"\n### {family}\n")
        table(family, list(rows.values()), args.tensors)
        memory_table(family, list(rows.values()), args.tensors)
    if probe:
        print_probe(probe)
    print_environment(rows, venvs, args)
    if args.json:
        out = [{k: v for k, v in r.items() if k != "contestant"} for r in rows.values()]
        harness.write_json(args.json, out, args=dict(vars(args), cache_dir=str(args.cache_dir)), cpu_model=cpu_model(),
                           venvs=venvs, decay_probe=probe)
    for f in work.glob("*.bin"):
        f.unlink()
    failed = [r["label"] for r in rows.values() if r.get("skip") and "venv" not in r["skip"]]
    if failed:
        print(f"\nworker logs (stderr of each contestant) kept in {work}")
    else:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
