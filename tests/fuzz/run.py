"""The fuzz harness of the native ops: every op, through every route to it, against its
reference kernel, on drawn legal calls and on calls with one fault put in.

    python tests/fuzz/run.py                         # 3 seeds, 10 minutes each
    python tests/fuzz/run.py --seeds 0 --cases 40    # CI's slice (tests/fuzz/test_fuzz.py)
    python tests/fuzz/run.py --repro fused_adam_:0:17  # one case, in this process, said in full
    bash tools/sanitize.sh tests/fuzz/run.py ...     # the same under ASan + UBSan

Cases run in a child process that the parent feeds one case at a time: a case that
crashes the child or runs past --timeout is reported with its reproducer, and a new
child goes on with the next case. A finding is any disagreement with the reference (a
value, a flag, an error's class or words), an error that is not a clear refusal
(outcome.unclear), or a refused call that wrote before refusing. The exit status is 1
when there is one.
"""

import argparse
import copy
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

BAD_SHARE = 0.4  # of the cases, those with one fault put in
# Ops whose outputs come from sums over a row or a batch (means, variances, weight grads),
# in another order than the reference's: ten times the dtype's tolerance (a mean of
# large values cancels digits in any float32 method: tests/normalization/test_norm_ops.py).
RECOMPUTED = ("layer_norm", "rms_norm", "fused_add_rms_norm", "sync_batch_norm")


def _rel(op_name, args):
    import outcome
    return outcome.loosest(args, 10.0 if op_name.startswith(RECOMPUTED) else 1.0)
THREADS = (1, 2, 3)  # torch's intra-op threads for a case: the CPU kernels split work by them


class Spec:
    """What the harness fuzzes under one name: ``draw(d)`` makes a call's arguments,
    ``routes`` take them, ``reference`` says what they must do, and faults go into the
    arguments of ``schema``'s op. A native op's spec has the raw route and the
    reference kernel; a spec of a public autograd route (a forward and its backward)
    brings its own reference, composed of the reference kernels."""

    def __init__(self, name, draw, routes, reference=None, schema=None, floors=None):
        self.name, self.draw, self.extra = name, draw, routes
        self.reference, self.schema = reference, schema or name
        self.floors = floors  # (args, the reference's outcome) -> {tensor position: magnitude}

    @property
    def native(self):
        return self.reference is None

    def routes(self):
        from core_ops._schemas import op
        return {"raw": op(self.name), **self.extra} if self.native else dict(self.extra)

    def want(self):
        from core_ops.reference import KERNELS as REF
        return REF[self.name] if self.native else self.reference


def specs():
    """{name: Spec}: every native op, then the public autograd routes of the norms."""
    from specs_multi_tensor import SPECS as multi_tensor
    from specs_norms import FLOORS, SPECS as norms
    from specs_optimizers import FLOORS as OPTIMIZER_FLOORS, SPECS as optimizers
    floors = {**FLOORS, **OPTIMIZER_FLOORS}
    return {name: Spec(name, *value, floors=floors.get(name))
            for name, value in {**multi_tensor, **optimizers, **norms}.items()}


def _floors(op_name, args, want):
    import outcome
    floors = specs()[op_name].floors
    return floors(args, want) if floors and not isinstance(want[1], outcome.Raised) else None


# ---- one case (in the child) ----------------------------------------------------------

def build_case(op_name, seed, index):
    """(args, what): the call of case ``index`` of ``seed`` for ``op_name``."""
    import core_ops  # noqa: F401  (declares the ops: their schemas drive bad.py)
    from bad import mutate
    from draw import Draw
    d = Draw(seed, op_name, index)
    spec = specs()[op_name]
    args, what = spec.draw(d), "legal"
    if d.chance(BAD_SHARE):
        faulty = mutate(d, spec.schema, args)
        if faulty is not None:
            args, what = faulty
    return args, what, d


def routes_of(op_name, only=None):
    routes = specs()[op_name].routes()
    return {k: v for k, v in routes.items() if only is None or k in only}


# The routes whose errors are compared by class only: Apex's stand-ins and the classes
# check their own arguments first and name them as their callers know them.
OWN_WORDS = ("amp_C", "apex", "class")


def run_case(op_name, seed, index, only_routes=None, ran=None):
    """The findings of one case: a list of dicts (empty when all agree). The routes
    that could take the call are added to ``ran``. Runs with the case's number of
    intra-op threads, and leaves the process's as it was."""
    import torch
    threads = torch.get_num_threads()
    try:
        return _run_case(op_name, seed, index, only_routes, [] if ran is None else ran)
    finally:
        torch.set_num_threads(threads)


def _run_case(op_name, seed, index, only_routes, ran):
    import torch

    import outcome
    args, what, d = build_case(op_name, seed, index)
    torch.set_num_threads(d.pick(THREADS))
    want = outcome.run(specs()[op_name].want(), args)
    rel, floors = _rel(op_name, args), _floors(op_name, args, want)
    found = []

    def note(route, why):
        found.append({"op": op_name, "seed": seed, "case": index, "route": route, "input": what, "finding": why})

    routes = routes_of(op_name, only_routes)
    for route, fn in routes.items():
        try:
            got = outcome.run(fn, args)
        except outcome.NotThisRoute:
            continue
        ran.append(route)
        why = outcome.compare(got, want, same_message=route not in OWN_WORDS, rel=rel, floors=floors)
        if why is None and isinstance(got[1], outcome.Raised) and route == "raw":
            why = _wrote_before_refusing(got[0], args)
        if why:
            note(route, why)
    if "raw" in routes and d.chance(0.15):  # the same call from two Python threads at once
        results = [None, None]

        def worker(k):
            results[k] = outcome.run(routes["raw"], args)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k, got in enumerate(results):
            why = outcome.compare(got, want, rel=rel, floors=floors)
            if why:
                note(f"raw, Python thread {k} of 2", why)
    return found


def _wrote_before_refusing(after, before):
    import torch

    from outcome import tensors_of
    for a, b in zip(tensors_of(after), tensors_of(before)):
        if a.device.type != "meta" and a.layout == torch.strided and b.layout == torch.strided \
                and not torch.equal(a.double().nan_to_num(7.5), b.double().nan_to_num(7.5)):
            return "refused after writing into its arguments"
    return None


def child(only_routes):
    """Reads "op seed index" lines, answers one JSON line each."""
    import torch  # noqa: F401

    import core_ops  # noqa: F401
    from core_ops import native
    backend = native.ensure("cpu")
    print(json.dumps({"ready": backend.native, "reason": backend.reason}), flush=True)
    for line in sys.stdin:
        op_name, seed, index = line.rstrip("\n").split("\t")
        ran = []
        try:
            found = run_case(op_name, int(seed), int(index), only_routes, ran)
        except Exception as e:  # noqa: BLE001: a broken case is a finding too
            found = [{"op": op_name, "seed": int(seed), "case": int(index), "route": "harness",
                      "input": "?", "finding": f"the case itself failed: {type(e).__name__}: {e}"}]
        print(json.dumps({"done": [op_name, int(seed), int(index)], "found": found, "ran": ran}), flush=True)


# ---- the parent ------------------------------------------------------------------------

class Child:
    def __init__(self, only_routes):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child"]
        if only_routes:
            cmd += ["--routes", ",".join(only_routes)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1)
        ready = self.read(600)
        if ready is None or not ready.get("ready"):
            raise SystemExit(f"the fuzz child did not start with native CPU kernels: {ready or self.stderr()}")

    def read(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                return None
            line = self.proc.stdout.readline()
            if not line:
                return None  # the child died
            if line.startswith("{"):
                return json.loads(line)

    def stderr(self):
        self.proc.kill()
        self.proc.wait()
        return self.proc.stderr.read()[-3000:]


def reproducer(op_name, seed, index):
    return f"python tests/fuzz/run.py --repro {op_name}:{seed}:{index}"


def fuzz(seeds, cases=None, seconds=None, ops=None, timeout=120, only_routes=None, say=print, ran=None):
    """Runs the cases; returns (findings, {op: cases run}); ``ran`` (a dict) gets
    {(op, route): cases that route took}. Ops take turns, case by case, so a time
    limit covers every op alike."""
    names = sorted(ops or specs())
    findings, counts = [], {n: 0 for n in names}
    ran = {} if ran is None else ran
    child_ = Child(only_routes)
    for seed in seeds:
        start = time.monotonic()
        index = 0
        while (cases is None or index < cases) and (seconds is None or time.monotonic() - start < seconds):
            for op_name in names:
                child_.proc.stdin.write(f"{op_name}\t{seed}\t{index}\n")
                child_.proc.stdin.flush()
                answer = child_.read(timeout)
                counts[op_name] += 1
                if answer is None:
                    dead = child_.proc.poll() is not None
                    err = child_.stderr()
                    last = err.strip().splitlines()[-1] if err.strip() else "nothing on stderr"
                    findings.append({"op": op_name, "seed": seed, "case": index, "route": "all", "input": "?",
                                     "finding": ("crashed: " if dead else f"hung past {timeout} s: ") + last})
                    say(f"  {op_name} case {index}: {findings[-1]['finding']}")
                    child_ = Child(only_routes)
                    continue
                for route in answer["ran"]:
                    ran[op_name, route] = ran.get((op_name, route), 0) + 1
                for f in answer["found"]:
                    findings.append(f)
                    say(f"  {f['op']} seed {f['seed']} case {f['case']} [{f['route']}; {f['input']}]: {f['finding']}")
            index += 1
    child_.proc.stdin.close()
    child_.proc.wait(timeout=60)
    return findings, counts


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=None, help="per seed (default 600 without --cases)")
    parser.add_argument("--cases", type=int, default=None, help="per op and seed")
    parser.add_argument("--ops", default=None, help="comma-separated op names (default: all)")
    parser.add_argument("--routes", default=None,
                        help="comma-separated: raw, public, amp_C, apex, class (default: all)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds a case may take (default 120; 300 under CORE_OPS_SANITIZE=1, where a case "
                             "of 2,000 tensors takes 20 s on 2 idle cores)")
    parser.add_argument("--repro", default=None, help="OP:SEED:INDEX, run here and said in full")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    only_routes = a.routes.split(",") if a.routes else None
    if a.child:
        return child(only_routes)
    if a.repro:
        return repro(*a.repro.split(":"), only_routes)
    seconds = a.seconds if a.seconds is not None or a.cases is not None else 600
    t0 = time.monotonic()
    timeout = a.timeout or (300 if os.environ.get("CORE_OPS_SANITIZE") == "1" else 120)
    ran = {}
    findings, counts = fuzz(a.seeds, a.cases, seconds, a.ops.split(",") if a.ops else None, timeout, only_routes,
                            ran=ran)
    for op_name in sorted(counts):
        taken = ", ".join(f"{route} {n}" for (o, route), n in sorted(ran.items()) if o == op_name)
        print(f"  {op_name}: {counts[op_name]} cases; routes taken: {taken or 'none'}")
    print(f"fuzz: {sum(counts.values())} cases over {len(counts)} ops, seeds {a.seeds}, "
          f"{time.monotonic() - t0:.0f} s: {len(findings)} findings")
    for f in findings:
        print(f"  {reproducer(f['op'], f['seed'], f['case'])}  # {f['route']}: {f['finding']}")
    return 1 if findings else 0


def repro(op_name, seed, index, only_routes):
    import torch

    import core_ops  # noqa: F401
    import outcome
    from core_ops import native
    print("native:", native.ensure("cpu").reason)
    args, what, d = build_case(op_name, int(seed), int(index))
    print(f"{op_name} seed {seed} case {index}: {what}")
    for k, a in enumerate(args):
        items = a if isinstance(a, (list, tuple)) else [a]
        shown = [f"{list(t.shape)} {str(t.dtype)[6:]} {t.stride()}{' ' + t.device.type if t.device.type != 'cpu' else ''}"
                 if isinstance(t, torch.Tensor) else repr(t) for t in items[:6]]
        print(f"  arg {k}: {'[' if isinstance(a, (list, tuple)) else ''}{', '.join(shown)}"
              f"{f', ... ({len(items)})' if len(items) > 6 else ''}{']' if isinstance(a, (list, tuple)) else ''}")
    want = outcome.run(specs()[op_name].want(), args)
    rel, floors = _rel(op_name, args), _floors(op_name, args, want)
    print("  reference:", want[1] if isinstance(want[1], outcome.Raised) else "returned")
    for route, fn in routes_of(op_name, only_routes).items():
        try:
            got = outcome.run(fn, copy.deepcopy(args))
        except outcome.NotThisRoute as e:
            print(f"  {route}: not this route's call ({e})")
            continue
        print(f"  {route}: {got[1] if isinstance(got[1], outcome.Raised) else 'returned'}; "
              f"{outcome.compare(got, want, same_message=route not in OWN_WORDS, rel=rel, floors=floors) or 'agrees'}")
    found = run_case(op_name, int(seed), int(index), only_routes)
    return 1 if found else 0


if __name__ == "__main__":
    os.environ.setdefault("CORE_OPS_AUTOLOAD", "0")
    sys.exit(main())
