"""Note [CPU levels]: the CPU library as the wheel holds it, every x86-64 level in one
library: each level's wide instructions only in that level's own symbols, the level
chosen at load (CORE_OPS_CPU_LEVEL lowers it), and every level's kernels agreeing with
the reference."""

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from core_ops.native import build, toolchain

pytestmark = pytest.mark.skipif(not build.is_x86(), reason="the levels are x86-64's")

# The levels this CPU runs, as torch detected them.
_RUNS = {"DEFAULT": ["baseline"], "AVX2": ["baseline", "avx2"], "AVX512": ["baseline", "avx2", "avx512"]}
RUNNABLE = _RUNS.get(torch.backends.cpu.get_cpu_capability(), ["baseline"])


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    cxx, ninja = toolchain.cxx(), toolchain.ninja()
    if cxx is None or ninja is None:
        pytest.skip("no C++ compiler or ninja: the levels cannot be built here")
    folder = tmp_path_factory.mktemp("levels")
    path = folder / "core_ops_cpu.so"
    build.cpu_library(path, folder / "build", list(build.LEVELS), cxx, ninja, jobs=toolchain.usable_cores())
    return path


def _function_blocks(path):
    """{mangled function name: its disassembly} of the library."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True,
                          check=True).stdout
    blocks, name = {}, None
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if head:
            name = head.group(1)
            blocks[name] = []
        elif name is not None:
            blocks[name].append(line)
    return {n: "\n".join(lines) for n, lines in blocks.items()}


def test_wide_instructions_only_in_their_levels_symbols(library):
    """A function the linker may share between levels (a global or weak symbol: inline
    functions of torch's headers and the standard library) holds no AVX register unless
    its name is its level's; else a baseline CPU could run an AVX copy the linker kept."""
    if shutil.which("objdump") is None or shutil.which("nm") is None:
        pytest.skip("no objdump / nm (binutils) to read the library with")
    symbols = subprocess.run(["nm", "--defined-only", str(library)], capture_output=True, text=True, check=True).stdout
    shared = {parts[2] for parts in (line.split() for line in symbols.splitlines())
              if len(parts) == 3 and parts[1] in "TWV"}
    blocks = _function_blocks(library)
    wide = {name: body for name, body in blocks.items() if "%ymm" in body or "%zmm" in body}
    assert any("6avx512" in name for name in wide) and any("4avx2" in name for name in wide), \
        "no AVX code found: were the levels compiled with their flags?"
    wrong = [name for name, body in wide.items() if name in shared and not (
        "6avx512" in name if "%zmm" in body else ("4avx2" in name or "6avx512" in name))]
    assert not wrong, f"{len(wrong)} shared functions hold another level's registers, e.g. {wrong[:3]}"


_BATTERY = textwrap.dedent("""
    import sys, torch
    import core_ops
    from core_ops import native, reference
    from core_ops.native import loader
    torch.ops.load_library(sys.argv[1])
    # this library serves the public ops too: no JIT build beside it
    loader._settled["cpu"] = native.Backend(True, "the library under test", sys.argv[1])
    print(torch.ops.core_ops.native_cpu_level(torch.empty(0)))
    g = torch.Generator().manual_seed(0)
    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)
    worst = {}
    def close(name, got, want, tol):
        # normwise: the largest error against the largest value (outputs near 0 abound)
        err = ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()
        worst[name] = err
        assert err <= tol, (name, err)
    # multi-tensor: sizes off every vector width, so tails run too
    xs = [rand(n) for n in (1, 17, 1000, 40003)]
    close("l2norm", core_ops.multi_tensor_l2norm(xs)[0], torch.cat(xs).double().norm(), 1e-6)
    out = [torch.empty_like(x) for x in xs]
    core_ops.multi_tensor_scale(xs, out, 0.5)
    close("scale", torch.cat(out), torch.cat(xs) * 0.5, 0.0)
    # Adam on bf16 params with fp32 masters, against the reference kernel
    for dtype in (torch.float32, torch.bfloat16):
        p = [rand(n, dtype=dtype) for n in (33, 5000)]
        g_ = [rand(t.numel()).to(dtype) for t in p]
        runs = []
        for kernel in (torch.ops.core_ops.fused_adam_, reference.KERNELS["fused_adam_"]):
            params = [t.clone() for t in p]
            grads = [t.clone() for t in g_]
            state = [[torch.zeros(t.numel()) for t in p] for _ in range(2)]
            masters = [t.float() for t in params] if dtype == torch.bfloat16 else []
            steps = [torch.zeros(1) for _ in p]
            kernel(params, grads, state[0], state[1], [], masters, steps, 1e-2, 0.9, 0.999, 1e-8, 0.01,
                   True, True, False, False, None, None, None)
            runs.append(torch.cat([t.float() for t in params + state[0] + state[1] + masters]))
        close(f"adam {dtype}", runs[0], runs[1], 0.0)
    # compact Adam (Note [Compact state in one pass]): every moment and weight kind on
    # bf16 params, sizes off the vector width and the 256-element block, grads scaled
    # and not, three steps; bit for bit against the reference kernel
    from core_ops.reference.compact_state import dynamic_map, quantize
    def bits(ts):
        return torch.cat([t.reshape(-1).view(torch.uint8) for t in ts]) if ts else torch.empty(0, dtype=torch.uint8)
    for moments, weights in (("float32", "remainder"), ("bfloat16", "remainder"), ("int8", "remainder"),
                             ("int8", "master"), ("bfloat16", "param")):
        sizes = (33, 5000, 16384 + 300)
        p = [rand(n, dtype=torch.bfloat16) for n in sizes]
        g_ = [rand(n, dtype=torch.bfloat16) for n in sizes]
        m_, v_ = [rand(n) * 0.1 for n in sizes], [rand(n).abs() * 0.01 for n in sizes]
        r_ = [(rand(n) * 9000).to(torch.int16) for n in sizes]
        maps = (dynamic_map(True), dynamic_map(False)) if moments == "int8" else (None, None)
        for scale in (None, torch.tensor([8.0])):
            runs = []
            for kernel in (torch.ops.core_ops.fused_adam_compact_, reference.KERNELS["fused_adam_compact_"]):
                params, grads = [t.clone() for t in p], [t.clone() for t in g_]
                if moments == "int8":
                    (ms, ma), (vs, va) = [list(zip(*[quantize(x, q) for x in xs])) for xs, q in zip((m_, v_), maps)]
                    ms, ma, vs, va = list(ms), list(ma), list(vs), list(va)
                else:
                    dt = torch.float32 if moments == "float32" else torch.bfloat16
                    ms, vs, ma, va = [x.to(dt, copy=True) for x in m_], [x.to(dt, copy=True) for x in v_], [], []
                mp = {"remainder": [t.clone() for t in r_], "master": [t.float() for t in p], "param": []}[weights]
                steps = [torch.tensor(float(i)) for i in range(len(sizes))]
                for _ in range(3):
                    kernel(params, grads, ms, vs, ma, va, mp, steps, *maps, 1e-2, 0.9, 0.999, 1e-8, 0.01, True,
                           True, False, None, scale, None)
                runs.append([bits(ts) for ts in (params, grads, ms, vs, ma, va, mp)])
            for name, got, want in zip(("params", "grads", "exp_avgs", "exp_avg_sqs", "exp_avg_absmaxes",
                                        "exp_avg_sq_absmaxes", "masters"), *runs):
                assert torch.equal(got, want), ("compact", moments, weights, scale, name)
    # layer norm forward, fp32 and bf16
    for dtype in (torch.float32, torch.bfloat16):
        x, w, b = rand(7, 300, dtype=dtype), rand(300, dtype=dtype), rand(300, dtype=dtype)
        got = torch.ops.core_ops.layer_norm_fwd(x, w, b, 300, 1e-5, None, False)[0]
        want = torch.nn.functional.layer_norm(x.double(), (300,), w.double(), b.double(), 1e-5)
        close(f"layer_norm {dtype}", got, want, 1e-5 if dtype == torch.float32 else 1e-2)
    print("WORST", worst)
""")


@pytest.mark.parametrize("level", ["baseline", "avx2", "avx512"])
def test_each_level_is_chosen_on_request_and_agrees_with_the_reference(library, level):
    if level not in RUNNABLE:
        pytest.skip(f"this CPU ({torch.backends.cpu.get_cpu_capability()}) does not run {level}")
    proc = subprocess.run([sys.executable, "-c", _BATTERY, str(library)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "CORE_OPS_CPU_LEVEL": level})
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stdout.splitlines()[0]
    assert said.startswith(f"{level} (this CPU runs {RUNNABLE[-1]}; CORE_OPS_CPU_LEVEL={level}; "
                           "compiled in: baseline, avx2, avx512)"), said


def test_unset_the_highest_level_this_cpu_runs_is_taken(library):
    env = {k: v for k, v in os.environ.items() if k != "CORE_OPS_CPU_LEVEL"}
    proc = subprocess.run([sys.executable, "-c", "import sys, torch, core_ops; torch.ops.load_library(sys.argv[1]); "
                           "print(torch.ops.core_ops.native_cpu_level(torch.empty(0)))", str(library)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == (f"{RUNNABLE[-1]} (this CPU runs {RUNNABLE[-1]}; compiled in: baseline, avx2, "
                                   "avx512)")
