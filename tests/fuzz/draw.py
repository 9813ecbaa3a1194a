"""Seeded drawing of the tensors a fuzz case passes: shapes around the kernels' vector
widths and chunk sizes, every memory layout a user can hand an op, dtype mixes, and
non-finite values where an op promises something about them. One ``Draw`` per case,
seeded by (seed, op, case index), so a case is rebuilt exactly from its reproducer."""

import random

import torch

# Around 8, 16 and 32 floats (a vector, two of them with AVX2 / AVX-512), a CUDA pack,
# the CPU kernels' chunk of 16384 values, and none at all.
SIZES = (0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129, 255, 256, 257, 1023, 1025,
         4095, 4097, 16383, 16384, 16385, 40000)
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# Layouts of a tensor's memory: dense ones the kernels walk in place, others they copy.
DENSE_LAYOUTS = ("contiguous", "offset", "transposed", "channels_last")
LAYOUTS = DENSE_LAYOUTS + ("sliced", "strided")
READ_ONLY_LAYOUTS = LAYOUTS + ("expanded",)


class Draw:
    def __init__(self, *key):
        self.key = ":".join(map(str, key))
        self.rng = random.Random(self.key)
        self.gen = torch.Generator().manual_seed(self.rng.getrandbits(63))

    # ---- numbers ----
    def chance(self, p):
        return self.rng.random() < p

    def pick(self, options):
        return self.rng.choice(list(options))

    def size(self, big=True):
        sizes = SIZES if big else [s for s in SIZES if s <= 1025]
        return self.pick(sizes)

    def count(self):
        """How many tensors a list holds: mostly a few, sometimes none or thousands."""
        r = self.rng.random()
        if r < 0.05:
            return 0
        if r < 0.12:
            return self.rng.randint(300, 2500)  # many tiny ones: more than one launch's worth
        return self.rng.randint(1, 6)

    def sizes(self, n):
        if n > 200:
            return [self.rng.randint(0, 5) for _ in range(n)]
        return [self.size(big=n <= 3) for _ in range(n)]

    # ---- tensors ----
    def values(self, numel, dtype, kind="normal"):
        v = torch.randn(numel, generator=self.gen, dtype=torch.float64)
        if kind == "positive":
            v = v.abs() + 0.01
        elif kind == "normal":
            v = v * self.pick((1e-3, 1.0, 1.0, 30.0))
        return v.to(dtype)

    def with_nonfinite(self, t):
        """t with inf, -inf or nan at its first, middle or last element."""
        if t.numel() == 0:
            return t
        flat = t.reshape(-1) if t.is_contiguous() else None
        where = self.pick((0, t.numel() // 2, t.numel() - 1))
        value = self.pick((float("inf"), float("-inf"), float("nan")))
        if flat is not None:
            flat[where] = value
        else:
            idx = torch.unravel_index(torch.tensor(where), t.shape)
            t[tuple(int(i) for i in idx)] = value
        return t

    def tensor(self, numel, dtype, layout="contiguous", kind="normal"):
        """A tensor of ``numel`` elements (1-D, or 2-D / 4-D for layouts that need
        dims) laid out in memory as ``layout`` says."""
        values = self.values(numel, dtype, kind)
        if numel == 0 or layout == "contiguous":
            return values.clone()
        if layout == "offset":  # dense, but starting one element into its storage
            base = torch.empty(numel + 1, dtype=dtype)
            base[1:] = values
            return base[1:]
        rows = self._split(numel)
        if layout == "transposed":  # dense, walked column-major
            return values.reshape(numel // rows, rows).clone().t()
        if layout == "channels_last":
            if numel % 4:
                return values.clone()
            return values.reshape(1, numel // 4, 2, 2).contiguous(memory_format=torch.channels_last)
        if layout == "sliced":  # rows of a wider matrix
            base = torch.zeros(rows, numel // rows + 3, dtype=dtype)
            base[:, : numel // rows] = values.reshape(rows, numel // rows)
            return base[:, : numel // rows]
        if layout == "strided":  # every other element
            base = torch.zeros(2 * numel, dtype=dtype)
            base[::2] = values
            return base[::2]
        if layout == "expanded":  # one row repeated: a stride of 0 (read-only inputs only)
            cols = numel // rows
            return values[:cols].reshape(1, cols).expand(rows, cols)
        raise ValueError(layout)

    def shaped(self, shape, dtype, layout="contiguous", kind="normal"):
        """A tensor of ``shape`` in its own memory, laid out as ``layout`` says where
        the shape allows (else contiguous): another list's tensor at the same index."""
        shape = tuple(shape)
        numel = 1
        for n in shape:
            numel *= n
        values = self.values(numel, dtype, kind).reshape(shape)
        if numel == 0 or not shape or layout == "contiguous":
            return values
        if layout == "offset":
            flat = torch.empty(numel + 1, dtype=dtype)
            return flat[1:].view(shape).copy_(values)
        if layout == "transposed" and len(shape) >= 2:
            dims = list(range(len(shape)))[::-1]
            return values.permute(dims).contiguous().permute(dims)
        if layout == "channels_last" and len(shape) == 4:
            return values.contiguous(memory_format=torch.channels_last)
        if layout == "sliced":
            wide = torch.zeros(*shape[:-1], shape[-1] + 3, dtype=dtype)
            return wide[..., : shape[-1]].copy_(values)
        if layout == "strided":
            wide = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)
            return wide[..., ::2].copy_(values)
        if layout == "expanded" and shape[0] > 1:
            return values[:1].expand(shape)
        return values

    def _split(self, numel):
        """A divisor of numel to shape it into rows (1 when it is prime)."""
        divisors = [d for d in (2, 3, 4, 5, 7, 8, 16) if numel % d == 0 and numel // d > 0]
        return self.pick(divisors) if divisors else 1

    def like(self, t, dtype=None, kind="normal"):
        """A new tensor of t's shape in its own memory, laid out as t when t is dense
        (what optimizer state must be), in ``dtype``."""
        values = self.values(t.numel(), dtype or t.dtype, kind).reshape(t.shape)
        return torch.empty_like(t, dtype=dtype or t.dtype).copy_(values)

    def layout(self, dense_only=False, read_only=False):
        if dense_only:
            return self.pick(DENSE_LAYOUTS)
        return self.pick(READ_ONLY_LAYOUTS if read_only else LAYOUTS)

