"""The element-wise halves of int8 / fp8 products on the GPU, as Triton kernels.

* `quantise_int8(x, scale, out)`: `out = saturate(rint(float32(x) / scale))` to int8 with one
  scale for the whole tensor, NaN to -128: `quantizelinear`'s arithmetic (`ops/quant.py`), in one
  pass over memory (eager torch takes five). Round half to even without libdevice: adding and
  subtracting 1.5 * 2**23 rounds a float32 of magnitude below 2**22 to an integer, half to even
  (the value is clamped to [-128, 127] first, which commutes with rounding to integers).
* `dequantise(acc, scale, out)`: `out[m, n] = float32(acc[m, n]) * scale[n]` (the folded scale
  of `quant_dot`'s dequantizelinear), int32 or float32 sums in, any float type out: the
  epilogue of `torch._int_mm` / `torch._scaled_mm`, one kernel instead of a cast and a multiply.

Both take 2-D row-major views (the caller flattens); on a machine without a GPU they run under
`TRITON_INTERPRET=1` on CPU tensors, and `eager_*` give the same numbers with torch ops where
Triton is off.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024
_BLOCK_M, _BLOCK_N = 32, 64
_MAGIC = 12582912.0  # 1.5 * 2**23


@triton.jit
def _quantise_int8_kernel(x_ptr, scale_ptr, out_ptr, n, BLOCK: tl.constexpr, MAGIC: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(scale_ptr).to(tl.float32)
    v = tl.math.div_rn(x, s)
    v = tl.minimum(tl.maximum(v, -128.0), 127.0)
    v = (v + MAGIC) - MAGIC
    v = tl.where(x != x, -128.0, v)  # NaN -> the low end, as the reference's cast gives
    tl.store(out_ptr + offs, v.to(tl.int8), mask=mask)


@triton.jit
def _dequantise_kernel(
    acc_ptr, scale_ptr, out_ptr, M, N, stride_am, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    acc = tl.load(acc_ptr + rows[:, None] * stride_am + cols[None, :], mask=mask, other=0)
    s = tl.load(scale_ptr + cols, mask=cols < N, other=0.0)
    y = acc.to(tl.float32) * s[None, :]
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :],
        y.to(out_ptr.dtype.element_ty),
        mask=mask,
    )


def quantise_int8(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    """`out = saturate(rint(x / scale))` (int8) for a dense `x`, `out` laid out alike, and a
    one-element float32 `scale`."""
    n = x.numel()
    if n == 0:
        return
    grid = (triton.cdiv(n, _BLOCK),)
    _quantise_int8_kernel[grid](x, scale, out, n, BLOCK=_BLOCK, MAGIC=_MAGIC, num_warps=4)


def dequantise(acc: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    """`out = acc * scale[None, :]` in float32, stored in `out`'s type (2-D, unit inner
    stride; `scale` a contiguous float32 vector of `acc.shape[1]`)."""
    m, n = acc.shape
    if m == 0 or n == 0:
        return
    grid = (triton.cdiv(m, _BLOCK_M), triton.cdiv(n, _BLOCK_N))
    _dequantise_kernel[grid](
        acc, scale, out, m, n, acc.stride(0), out.stride(0),
        BLOCK_M=_BLOCK_M, BLOCK_N=_BLOCK_N, num_warps=4,
    )  # fmt: skip


def eager_quantise_int8(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    """`quantise_int8` with torch ops (several kernels)."""
    q = torch.round(x.to(torch.float32) / scale)
    out.copy_(torch.nan_to_num(q, nan=-128.0).clamp_(-128, 127))


def eager_dequantise(acc: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    """`dequantise` with torch ops."""
    out.copy_(acc.to(torch.float32) * scale)


__all__ = ["dequantise", "eager_dequantise", "eager_quantise_int8", "quantise_int8"]
