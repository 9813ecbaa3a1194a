"""Smallest reproducer of a torch inductor CPU bug (torch 2.14.1; also what breaks
litgpt's compiled GPT-NeoX / Pythia models with bfloat16 or float16 weights on a CPU):

    python tools/upstream/inductor_cpu_twin_reduction.py [bf16|fp16|fp32]

Two Linear layers with biases whose outputs are added receive the same gradient, so
their bias gradients are one and the same sum. Inductor computes that sum once and
stores it to both buffers; for a reduced-precision result, its C++ vector codegen
declares the converted value ``auto at_BFloat16_tmp_acc0_vec = ...`` once per store,
in one scope, and the kernel fails to compile:

    error: conflicting declaration 'auto at_BFloat16_tmp_acc0_vec'

float32 needs no conversion and compiles. Exit status 1 when the bug shows.
"""

import sys

import torch


class TwoBiases(torch.nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.a, self.b = torch.nn.Linear(width, width), torch.nn.Linear(width, width)

    def forward(self, x, y):
        return self.a(x) + self.b(y)


def main():
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        sys.argv[1] if len(sys.argv) > 1 else "bf16"]
    torch.manual_seed(0)
    model = TwoBiases().to(dtype)
    x, y = (torch.randn(16, 128, dtype=dtype) for _ in range(2))
    try:
        torch.compile(model)(x, y).float().sum().backward()
    except Exception as e:  # noqa: BLE001 (inductor wraps the compiler's error)
        line = next((ln for ln in str(e).splitlines() if "error:" in ln), str(e).splitlines()[0])
        print(f"torch {torch.__version__}, {dtype}: {type(e).__name__}: {line.strip()}")
        raise SystemExit(1)
    print(f"torch {torch.__version__}, {dtype}: compiles and runs")


if __name__ == "__main__":
    main()
