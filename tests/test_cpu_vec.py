"""core_ops/csrc/cpu/vec.h, the kernels' own vector layer, at every level this machine
runs: tests/support/vec_check.cpp compiled with the CPU library's flags for the level
(core_ops/native/build.py) checks each operation against scalar code, bit for bit on
edge values (Note [Vector results as at::vec] in vec.h). "generic" is the baseline
build with no intrinsics (CORE_OPS_VEC_GENERIC): the code aarch64 and other CPUs
compile, run here."""

import concurrent.futures
import re
import subprocess
from pathlib import Path

import pytest
import torch

from core_ops.native import build, toolchain

CHECK = Path(__file__).parent / "support" / "vec_check.cpp"
CPU_SOURCES = build.CSRC / "cpu"

# The x86-64 levels this CPU runs, as torch detected them.
_RUNS = {"DEFAULT": ["baseline"], "AVX2": ["baseline", "avx2"], "AVX512": ["baseline", "avx2", "avx512"]}
RUNNABLE = _RUNS.get(torch.backends.cpu.get_cpu_capability(), ["baseline"]) if build.is_x86() else ["baseline"]
VARIANTS = ["baseline", "generic", "avx2", "avx512"]


def _flags(variant):
    level = "baseline" if variant == "generic" else variant
    extra = ["-DCORE_OPS_VEC_GENERIC"] if variant == "generic" else []
    return [*build.common_flags(), *build.level_flags(level), *extra, f"-I{CPU_SOURCES}"]


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """{variant: the compiled check, or the compiler's error}, compiled side by side."""
    cxx = toolchain.cxx()
    if cxx is None:
        pytest.skip("no C++ compiler (c++ or $CXX) to build the vector checks with")
    folder = tmp_path_factory.mktemp("vec")
    wanted = [v for v in VARIANTS if v == "generic" or v in RUNNABLE]

    def compile_one(variant):
        out = folder / f"vec_check_{variant}"
        done = subprocess.run([cxx, *_flags(variant), str(CHECK), "-o", str(out)], capture_output=True, text=True)
        return variant, out if done.returncode == 0 else done.stderr[-4000:]

    with concurrent.futures.ThreadPoolExecutor(len(wanted)) as pool:
        return dict(pool.map(compile_one, wanted))


@pytest.mark.parametrize("variant", VARIANTS)
def test_vector_ops_match_scalar(programs, variant):
    if variant not in programs:
        pytest.skip(f"this CPU does not run the {variant} level" if build.is_x86() else
                    f"{variant} is an x86-64 level")
    program = programs[variant]
    assert isinstance(program, Path), f"vec_check.cpp did not compile at {variant}:\n{program}"
    run = subprocess.run([str(program), variant], capture_output=True, text=True, timeout=60)
    summary = re.search(r"vec_check (\w+) lanes=(\d+) checks=(\d+) failures=(\d+)", run.stdout)
    assert summary is not None, f"no summary from the check:\n{run.stdout}\n{run.stderr}"
    level, lanes, checks, failures = summary.group(1), int(summary.group(2)), int(summary.group(3)), int(summary.group(4))
    assert level == variant
    assert lanes == (16 if variant == "avx512" else 8)
    assert checks > 8_000_000  # every 16-bit pattern, ~850k floats per conversion, the ops' lanes
    assert failures == 0 and run.returncode == 0, run.stdout[-4000:]
