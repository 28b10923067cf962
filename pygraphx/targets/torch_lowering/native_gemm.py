"""A float32 product with a fixed, very wide weight (a language model's head) as a native kernel
(`native/kernels/gemm_wide.c`, helper gemm18).

`gemm_kernels.fast_kernel` takes it instead of oneDNN's matmul for a float32 product with no
activation whose weight has at least `MIN_COLUMNS` columns (GPT-2's LM head, 768 x 50257), at
most `MAX_DEPTH` rows, and a source of at least `MIN_ROWS` rows, where the kernel can be had
and `PGX_CPU_GEMM` is `auto`. Why, on the 2-core AMD EPYC (Zen 4): the
head streams its 154 MB weight from memory once a run, and oneDNN 3.2's brgemm ran it at
107-108 GFLOP/s a core (93 % of the register FMA peak, 116) where the same kernel runs a weight
that stays in cache at 115; OpenBLAS and BLIS were slower still (`benchmarks/gemm18_libs.py`).
The kernel (an 8 x 48 register block over the whole K, the weight packed once into 48-column
panels, the next panel prefetched into L2 while one is computed) runs the head at 110-111
(`benchmarks/results/gemm18.md`). Narrower weights stay on oneDNN (a 2304-column one gained
1-2 %, within the noise).

A float32 product whose GELU runs as the native pass after it (`gemm_gelu.native_gelu_f32`:
GPT-2's, BERT's, ViT's FFN-up, 768 x 3072) takes the kernel too from `GELU_MIN_COLUMNS` columns
(`available_gelu`; 1.03-1.05x oneDNN's speed on that shape, cold weights).

A float32 product cut into equal column parts (Q / K / V, `lower_gemm._batched_parts`) of 8 to
`PARTS_MAX_ROWS` rows takes the kernel's parts form (`available_parts`, `WideLinear(parts=)`:
each part a dense block of the result; GPT-2's / BERT-base's b1 QKV 1.03x oneDNN's batched
matmul at one thread, 1.01-1.02x at two; helper gemm18b). The kernel also has a K-blocked form
with a residual sum (`gemm_wide_f32_kb`), not taken by any product: on FFN-down (K = 3072) it
runs at 0.98-1.00x oneDNN's speed (`benchmarks/results/gemm18b.md`).

`PGX_CPU_GEMM_WIDE=0` keeps oneDNN's matmul for all these products, `PGX_CPU_GEMM_WIDE_GELU=0`
for the GELU ones only, `PGX_CPU_GEMM_WIDE_QKV=0` for the column-parts ones only. Without a C
compiler or AVX-512F the product keeps it too, said once (`native.announce_fallback`).
"""

from __future__ import annotations

import copy
import ctypes

import torch

from pygraphx.ir.env import switch_on
from pygraphx.targets import native

KERNEL = "gemm_wide"
#: `0` / `off`: a wide float32 product keeps oneDNN's matmul
ENV = "PGX_CPU_GEMM_WIDE"
#: the fewest weight columns a product takes the kernel with
MIN_COLUMNS = 16384
#: the fewest source rows and the most weight rows (K) it takes it with: the 2-core EPYC, one
#: thread, against oneDNN's speed: N = 50257, K = 768: 1 row 1.22x, 4 rows 0.92x, 8 rows 1.52x,
#: 16-64 rows 1.03-1.06x, 128 1.04-1.06x, 1024 1.03x; 128 x 2048 x 16384 1.035x, 128 x 4096 x
#: 16384 0.97x (the 48-column panel then fills L2: no K blocking here)
MIN_ROWS, MAX_DEPTH = 8, 2048

#: `0` / `off`: a float32 product whose GELU runs as the native pass keeps oneDNN's matmul
GELU_ENV = "PGX_CPU_GEMM_WIDE_GELU"
#: the fewest weight columns and the most weight rows of such a product on the kernel: GPT-2's /
#: BERT's FFN-up, 768 x 3072, 128 rows, 12 weights in turn (cold, as in a run) on the 2-core
#: EPYC: 1.03-1.04x oneDNN's speed at one thread (thread CPU), 1.05x at two (wall, quiet);
#: FFN-down (K = 3072) 0.91x and the 768-column products 0.97-0.99x stay on oneDNN
#: (`benchmarks/results/gemm18.md`)
GELU_MIN_COLUMNS, GELU_MAX_DEPTH = 3072, 1024

Tensor = torch.Tensor


def _bind(lib: ctypes.CDLL) -> None:
    lib.gemm_wide_supported.argtypes = []
    lib.gemm_wide_supported.restype = ctypes.c_int
    if not lib.gemm_wide_supported():
        raise native.NativeUnavailable(
            f"native kernel {KERNEL}: this processor has no AVX-512F (the build has no kernel)"
        )
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    lib.gemm_wide_panel.argtypes = []
    lib.gemm_wide_panel.restype = i64
    lib.gemm_wide_packed_size.argtypes = [i64, i64]
    lib.gemm_wide_packed_size.restype = i64
    lib.gemm_wide_scratch.argtypes = [i64, i64]
    lib.gemm_wide_scratch.restype = i64
    lib.gemm_wide_pack.argtypes = [vp, i64, i64, i64, vp]
    lib.gemm_wide_pack.restype = None
    lib.gemm_wide_f32.argtypes = [vp, i64, i64, i64, vp, vp, i64, vp, i64, vp, i64]
    lib.gemm_wide_f32.restype = ctypes.c_int
    lib.gemm_wide_scratch_kb.argtypes = [i64, i64, i64]
    lib.gemm_wide_scratch_kb.restype = i64
    lib.gemm_wide_f32_kb.argtypes = [vp, i64, i64, i64, vp, vp, i64, vp, i64, vp, i64, i64,
                                     ctypes.c_int]  # fmt: skip
    lib.gemm_wide_f32_kb.restype = ctypes.c_int
    lib.gemm_wide_f32_parts.argtypes = [vp, i64, i64, i64, vp, vp, i64, vp, i64, vp, i64, i64,
                                        i64]  # fmt: skip
    lib.gemm_wide_f32_parts.restype = ctypes.c_int


_BOUND = native.BoundLibrary(KERNEL, _bind)


def available(w: Tensor, rows: int, epilogue: str | None = None) -> bool:
    """Whether the float32 product of `rows` source rows with the fixed (K, N) weight `w` (and
    no `epilogue`) runs on the kernel: switched on, of a size it is faster at (`MIN_COLUMNS`,
    `MIN_ROWS`, `MAX_DEPTH`), and the kernel can be had (announcing once why not)."""
    if w.dtype != torch.float32 or w.dim() != 2 or epilogue is not None:
        return False
    k, n = w.shape
    if n < MIN_COLUMNS or rows < MIN_ROWS or not 1 <= k <= MAX_DEPTH or not switch_on(ENV):
        return False
    return _BOUND.available("oneDNN's matmul")


def available_gelu(w: Tensor, rows: int) -> bool:
    """Whether the float32 product of `rows` rows with the fixed (K, N) weight `w`, whose GELU
    group runs as the native pass after it (`gemm_gelu.native_gelu_f32`), runs on the kernel:
    `GELU_MIN_COLUMNS` columns or more, K at most `GELU_MAX_DEPTH`, `MIN_ROWS` rows or more and
    a multiple of the kernel's 8-row block (ViT-B/16's 197 rows: the FFN-up steps 1.2 % slower
    at one thread, a last block of 5 rows; GPT-2's / BERT's 128: 3-4 % faster), both switches
    on, the kernel had."""
    if w.dtype != torch.float32 or w.dim() != 2 or not switch_on(GELU_ENV):
        return False
    k, n = w.shape
    if n < GELU_MIN_COLUMNS or rows < MIN_ROWS or rows % 8 or not 1 <= k <= GELU_MAX_DEPTH:
        return False
    return switch_on(ENV) and _BOUND.available("oneDNN's matmul")


#: `0` / `off`: a float32 product in column parts (Q / K / V) keeps oneDNN's batched matmul
PARTS_ENV = "PGX_CPU_GEMM_WIDE_QKV"
#: the most weight rows (K) and source rows of such a product on the kernel: 12 weights in turn
#: (cold), one thread, against oneDNN's batched matmul: 128 x 768 x 2304 (GPT-2 / BERT-base b1)
#: 1.033-1.035x, 1024 x 768 x 2304 (b8) 1.005x, MiniLM's 1024 x 384 x 1152 0.993-0.997x
PARTS_MAX_DEPTH, PARTS_MAX_ROWS = 1024, 256


def available_parts(w: Tensor, rows: int, parts: int) -> bool:
    """Whether the float32 product of `rows` rows with the fixed (K, N) weight `w` in `parts`
    column parts of equal width (`lower_gemm._batched_parts`: GPT-2's / BERT's Q / K / V, 768
    each) runs on the kernel: each part a multiple of the 48-column panel, K at most
    `PARTS_MAX_DEPTH`, `MIN_ROWS` to `PARTS_MAX_ROWS` rows and a multiple of the 8-row block
    (as `available_gelu`), `PGX_CPU_GEMM_WIDE_QKV` and `PGX_CPU_GEMM_WIDE` on, the kernel had.
    128 x 768 x 2304, 12 weights in turn (cold) on the 2-core EPYC: 1.03-1.04x oneDNN's speed
    at one thread (`benchmarks/results/gemm18b.md`)."""
    if w.dtype != torch.float32 or w.dim() != 2 or parts < 2 or not switch_on(PARTS_ENV):
        return False
    k, n = w.shape
    if n % parts or (n // parts) % 48 or not MIN_ROWS <= rows <= PARTS_MAX_ROWS or rows % 8:
        return False
    if not 1 <= k <= PARTS_MAX_DEPTH:
        return False
    return switch_on(ENV) and _BOUND.available("oneDNN's batched matmul")


class WideLinear:
    """`x @ weight + bias` for a (rows, K) float32 source and the fixed (K, N) `weight`, packed
    once here; a call returns a new (rows, N) tensor, on torch's thread count of the call; with
    `parts` > 1 a new (parts, rows, N / parts) tensor, each part a dense block (`available_parts`)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, rows: int, parts: int = 1) -> None:
        lib = _BOUND.get()
        if weight.dtype != torch.float32 or weight.dim() != 2:
            raise ValueError(f"native {KERNEL}: a 2-D float32 weight, got {weight.dtype} "
                             f"{tuple(weight.shape)}")  # fmt: skip
        k, n = weight.shape
        if bias is not None and (bias.dtype != torch.float32 or bias.numel() != n):
            raise ValueError(f"native {KERNEL}: bias of {n} float32 values, got {bias.dtype} "
                             f"{tuple(bias.shape)}")  # fmt: skip
        w = weight if weight.stride(1) == 1 else weight.contiguous()
        self.packed = torch.empty(lib.gemm_wide_packed_size(k, n), dtype=torch.float32)
        lib.gemm_wide_pack(w.data_ptr(), k, n, w.stride(0), self.packed.data_ptr())
        self.bias = None if bias is None else bias.reshape(n).contiguous()
        self.scratch = torch.empty(max(lib.gemm_wide_scratch(rows, k), 1), dtype=torch.float32)
        self.rows, self.shape = rows, (k, n)
        self.fn, self.threads = lib.gemm_wide_f32, torch.get_num_threads
        if parts < 1 or n % parts or (parts > 1 and (n // parts) % lib.gemm_wide_panel()):
            raise ValueError(f"native {KERNEL}: {n} columns in {parts} parts of a multiple of "
                             f"{lib.gemm_wide_panel()}")  # fmt: skip
        self.parts, self.parts_fn = parts, lib.gemm_wide_f32_parts

    def without_bias(self) -> WideLinear:
        """The same product without the bias, on the same packed weight and scratch (the
        profiling steps' dot alone; a program's steps never run at once)."""
        twin = copy.copy(self)
        twin.bias = None
        return twin

    def __call__(self, x: Tensor) -> Tensor:
        (k, n), rows = self.shape, self.rows
        if x.dtype != torch.float32 or tuple(x.shape) != (rows, k):
            raise ValueError(f"native {KERNEL}: a ({rows}, {k}) float32 source, got {x.dtype} "
                             f"{tuple(x.shape)}")  # fmt: skip
        if x.stride(1) != 1 or x.stride(0) < k:
            x = x.contiguous()
        bias = None if self.bias is None else self.bias.data_ptr()
        if self.parts > 1:
            width = n // self.parts
            y = torch.empty(self.parts, rows, width, dtype=torch.float32)
            status = self.parts_fn(x.data_ptr(), rows, k, x.stride(0), self.packed.data_ptr(),
                                   bias, n, y.data_ptr(), width, self.scratch.data_ptr(),
                                   self.threads(), width, rows * width)  # fmt: skip
        else:
            y = torch.empty(rows, n, dtype=torch.float32)
            status = self.fn(x.data_ptr(), rows, k, x.stride(0), self.packed.data_ptr(), bias, n,
                             y.data_ptr(), n, self.scratch.data_ptr(), self.threads())  # fmt: skip
        if status:
            raise RuntimeError(f"native kernel {KERNEL}: not built for this processor")
        return y
