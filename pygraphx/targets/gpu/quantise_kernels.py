"""The element-wise halves of int8 / fp8 products on the GPU, as Triton kernels.

* `quantise_int8(x, scale, out)`: `out = saturate(rint(float32(x) / scale))` to int8 with one
  scale for the whole tensor, NaN to -128: `quantizelinear`'s arithmetic (`ops/quant.py`), in one
  pass over memory (eager torch takes five); the division is `quantise.quotient`. Round half
  to even without libdevice: adding and subtracting 1.5 * 2**23 rounds a float32 of magnitude
  below 2**22 to an integer, half to even (the value is clamped to [-128, 127] first, which
  commutes with rounding to integers).
* `dequantise(acc, scale, out)`: `out[m, n] = float32(acc[m, n]) * scale[n]` (the folded scale
  of `quant_dot`'s dequantizelinear), int32 or float32 sums in, any float type out: the
  epilogue of `torch._int_mm` / `torch._scaled_mm`, one kernel instead of a cast and a multiply.

* `quantise_fp8(x, scale, out)` and `fake_quantise_fp8` (quantise then dequantise at once, no
  fp8 tensor): the fp8 e4m3fn byte by the hardware conversion where `fp8_cast` says the device
  has one, else built from float32 bits (the same bytes).

The matrix products that use them, and share `fp8_cast`, are `quant_kernels`. On a machine
without a GPU they run under `TRITON_INTERPRET=1` on CPU tensors; `eager_*` give the same
numbers with torch ops where Triton is off.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from pygraphx.codegen.triton.quantise import (
    MAGIC,
    fp8_of_quotient,
    fp8_round,
    int8_of_quotient,
    quotient,
)

_BLOCK = 1024
_BLOCK_M, _BLOCK_N = 32, 64


@triton.jit
def _quantise_int8_kernel(x_ptr, scale_ptr, out_ptr, n, BLOCK: tl.constexpr, MAGIC: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(scale_ptr).to(tl.float32)
    v = quotient(x, s, tl.math.div_rn(1.0, s))
    tl.store(out_ptr + offs, int8_of_quotient(v, x, MAGIC), mask=mask)


@triton.jit
def _quantise_fp8_kernel(
    x_ptr, scale_ptr, out_ptr, n, BLOCK: tl.constexpr, MAGIC: tl.constexpr,
    ROUND_TRIP: tl.constexpr, CAST: tl.constexpr = False,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(scale_ptr).to(tl.float32)
    v = quotient(x, s, tl.math.div_rn(1.0, s))
    if ROUND_TRIP:  # dequantised at once: r * scale in the output's type
        r = fp8_round(tl.minimum(tl.maximum(v, -448.0), 448.0), MAGIC)
        r = tl.where(v != v, v, r)  # NaN stays NaN
        tl.store(out_ptr + offs, (r * s).to(out_ptr.dtype.element_ty), mask=mask)
    else:  # the byte (`CAST`: the hardware conversion, `fp8_cast`)
        tl.store(out_ptr + offs, fp8_of_quotient(v, x, s, MAGIC, CAST), mask=mask)


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


@functools.cache
def capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


#: the hardware fp8 conversion (`fp8_cast`): on by default where the device has one, `0` to
#: build the bytes from float32 bits instead (same bytes)
FP8_CAST_ENV = "PGX_GPU_FP8_CAST"


def fp8_cast(device: torch.device) -> bool:
    """Whether kernels compiled for `device` write fp8 e4m3fn bytes by the hardware conversion
    (`cvt.rn.satfinite.e4m3x2.f32`: the same bytes as `fp8_round` and `fp8_bits`, in far
    fewer instructions): an NVIDIA GPU of compute capability 8.9 or later, not under the
    interpreter (whose fp8 cast is not exact), unless `PGX_GPU_FP8_CAST=0`. On an H200 the
    bit-for-bit tests (`tests/codegen/test_quantise.py`, every rounding tie, saturation, NaN
    and signed zero against ml_dtypes) pass with it; BERT-base fp8 at batch 32 ran 1.937 ms
    with it against fp16's 2.044 in the same call."""
    if os.environ.get(FP8_CAST_ENV, "").strip() == "0":
        return False
    return fp8_cast_supported(device)


def fp8_cast_supported(device: torch.device) -> bool:
    """Whether `device` has the hardware fp8 conversion `fp8_cast` would use (what the tests
    check the bytes of, whatever the setting)."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    if os.environ.get("TRITON_INTERPRET", "") not in ("", "0"):
        return False
    index = torch.cuda.current_device() if device.index is None else device.index
    return capability(index) >= (8, 9)


def quantise_int8(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    """`out = saturate(rint(x / scale))` (int8) for a dense `x`, `out` laid out alike, and a
    one-element float32 `scale`."""
    n = x.numel()
    if n == 0:
        return
    grid = (triton.cdiv(n, _BLOCK),)
    _quantise_int8_kernel[grid](x, scale, out, n, BLOCK=_BLOCK, MAGIC=MAGIC, num_warps=4)


def quantise_fp8(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    """`out = fp8_e4m3fn(clamp(x / scale, +-448))` (round half to even, NaN stays NaN) for a
    dense `x`, `out` laid out alike, a one-element float32 `scale`: one pass (the fp8 byte by
    the hardware conversion where `fp8_cast`, else built from float32 bits, as the
    interpreter's fp8 cast is not exact)."""
    _fp8_launch(x, scale, out.view(torch.uint8), False)


def fake_quantise_fp8(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    """`out = dequantise(quantise_fp8(x))` = fp8 value * `scale` in `out`'s float type, one
    pass and no fp8 tensor (a `quantizelinear` whose only user is its `dequantizelinear`)."""
    _fp8_launch(x, scale, out, True)


def _fp8_launch(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, round_trip: bool) -> None:
    n = x.numel()
    if n == 0:
        return
    grid = (triton.cdiv(n, _BLOCK),)
    cast = not round_trip and fp8_cast(x.device)
    _quantise_fp8_kernel[grid](
        x, scale, out, n, BLOCK=_BLOCK, MAGIC=MAGIC, ROUND_TRIP=round_trip, CAST=cast, num_warps=4
    )


def eager_quantise_fp8(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    """`quantise_fp8` with torch ops (several kernels; torch's cast rounds half to even)."""
    v = x.to(torch.float32) / scale
    out.copy_(v.clamp_(-448.0, 448.0).to(torch.float8_e4m3fn))


def eager_fake_quantise_fp8(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    """`fake_quantise_fp8` with torch ops."""
    v = (x.to(torch.float32) / scale).clamp_(-448.0, 448.0).to(torch.float8_e4m3fn)
    out.copy_(v.to(torch.float32) * scale)


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


__all__ = [
    "FP8_CAST_ENV",
    "capability",
    "dequantise",
    "eager_dequantise",
    "eager_fake_quantise_fp8",
    "eager_quantise_fp8",
    "eager_quantise_int8",
    "fake_quantise_fp8",
    "fp8_cast",
    "fp8_cast_supported",
    "quantise_fp8",
    "quantise_int8",
]
