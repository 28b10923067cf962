"""The element-wise halves of int8 / fp8 products on the GPU, as Triton kernels.

* `quantise_int8(x, scale, out)`: `out = saturate(rint(float32(x) / scale))` to int8 with one
  scale for the whole tensor, NaN to -128: `quantizelinear`'s arithmetic (`ops/quant.py`), in one
  pass over memory (eager torch takes five). Round half to even without libdevice: adding and
  subtracting 1.5 * 2**23 rounds a float32 of magnitude below 2**22 to an integer, half to even
  (the value is clamped to [-128, 127] first, which commutes with rounding to integers).
* `dequantise(acc, scale, out)`: `out[m, n] = float32(acc[m, n]) * scale[n]` (the folded scale
  of `quant_dot`'s dequantizelinear), int32 or float32 sums in, any float type out: the
  epilogue of `torch._int_mm` / `torch._scaled_mm`, one kernel instead of a cast and a multiply.

* `int8_gemm(a, wt, scale, out)`: `out = (a @ wt.T) * scale[None, :]`, int8 operands, exact
  int32 sums in registers, the dequantise as the epilogue: the int32 product never goes to
  memory (`torch._int_mm` writes it and `dequantise` reads it back: 8 bytes per output element
  more). Tiles of 128 x 128 x 64 (fewer rows for small products), grouped launch order so
  neighbouring programs share weight tiles in L2.
* `int8_conv(x, wt, scale, out, geometry)`: the same for a convolution of a channels-last int8
  input, as an implicit GEMM (each K block is one kernel tap's run of channels, read in place:
  no patch matrix in memory), for inputs whose channels are a multiple of `CONV_BLOCK_K`.

They take 2-D views with unit inner stride (the caller flattens); on a machine without a GPU
they run under `TRITON_INTERPRET=1` on CPU tensors, and `eager_*` give the same numbers with
torch ops where Triton is off.
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


@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's output rows and columns (grouped order: neighbours share weight tiles)."""
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    return pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.jit
def _store_dequantised(acc, rows, cols, scale_ptr, out_ptr, M, N, stride_om):
    s = tl.load(scale_ptr + cols, mask=cols < N, other=0.0)
    y = (acc.to(tl.float32) * s[None, :]).to(out_ptr.dtype.element_ty)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], y, mask=mask)


@triton.jit
def _int8_gemm_kernel(
    a_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, stride_am, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    rows, cols = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        a = tl.load(
            a_ptr + rows[:, None] * stride_am + kk[None, :],
            mask=(rows[:, None] < M) & (kk[None, :] < K), other=0,
        )  # fmt: skip
        w = tl.load(
            w_ptr + cols[None, :] * stride_wn + kk[:, None],
            mask=(cols[None, :] < N) & (kk[:, None] < K), other=0,
        )  # fmt: skip
        acc = tl.dot(a, w, acc, out_dtype=tl.int32)
    _store_dequantised(acc, rows, cols, scale_ptr, out_ptr, M, N, stride_om)


@triton.jit
def _int8_conv_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, C, H, W, HO, WO, sxn, sxh, sxw,
    stride_wn, stride_om, SH, SW, PH, PW, DH, DW, KW,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    rows, cols = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    wo = rows % WO
    ho = (rows // WO) % HO
    base = (rows // (WO * HO)) * sxn
    h0, w0 = ho * SH - PH, wo * SW - PW
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):  # a block of K lies in one tap: C % BLOCK_K == 0
        tap = k0 // C
        kh = tap // KW
        hi, wi = h0 + kh * DH, w0 + (tap - kh * KW) * DW
        inside = (rows < M) & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
        offs = base + hi * sxh + wi * sxw + (k0 - tap * C)
        a = tl.load(x_ptr + offs[:, None] + ks[None, :], mask=inside[:, None], other=0)
        w = tl.load(
            w_ptr + cols[None, :] * stride_wn + (k0 + ks)[:, None], mask=cols[None, :] < N, other=0
        )
        acc = tl.dot(a, w, acc, out_dtype=tl.int32)
    _store_dequantised(acc, rows, cols, scale_ptr, out_ptr, M, N, stride_om)


def _config(m: int) -> dict[str, int]:
    block_m = 128 if m > 64 else max(16, triton.next_power_of_2(m))
    return {"BLOCK_M": block_m, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}


def _grid(m: int, n: int, config: dict[str, int]) -> tuple[int]:
    return (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"]),)


def int8_gemm(a: torch.Tensor, wt: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    """`out = float32(a @ wt.T) * scale` for int8 `a` (M, K) and `wt` (N, K), unit inner
    strides, float32 `scale` (N,), any float `out` (M, N)."""
    m, k = a.shape
    n = wt.shape[0]
    if m == 0 or n == 0:
        return
    config = _config(m)
    _int8_gemm_kernel[_grid(m, n, config)](
        a, wt, scale, out, m, n, k, a.stride(0), wt.stride(0), out.stride(0),
        **config, num_warps=8, num_stages=4,
    )  # fmt: skip


#: the K block of `int8_conv`: a convolution's input channels must be a multiple of it
CONV_BLOCK_K = 64


def int8_conv(
    x: torch.Tensor, wt: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, geometry: tuple
) -> None:
    """Implicit-GEMM convolution: `out[(n, ho, wo), c_out] = float32(sum x * w) * scale[c_out]`
    for the channels-last int8 `x` (N, C, H, W), `wt` (C_out, kh*kw*C) in (kh, kw, c) order,
    `out` (N*HO*WO, C_out) rows; `geometry` = (kw, stride, pads, dilation, HO, WO). No patch
    copy: each K block reads one tap's channels straight from `x` (zeros outside it)."""
    n, c, h, w = x.shape
    kw, (sh, sw), (ph, pw), (dh, dw), ho, wo = geometry
    m, k, c_out = n * ho * wo, wt.shape[1], wt.shape[0]
    if m == 0 or c_out == 0:
        return
    config = _config(m)
    config["BLOCK_K"] = CONV_BLOCK_K
    sxn, _, sxh, sxw = x.stride()
    _int8_conv_kernel[_grid(m, c_out, config)](
        x, wt, scale, out, m, c_out, k, c, h, w, ho, wo, sxn, sxh, sxw,
        wt.stride(0), out.stride(0), sh, sw, ph, pw, dh, dw, kw,
        **config, num_warps=8, num_stages=4,
    )  # fmt: skip


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


__all__ = [
    "dequantise",
    "eager_dequantise",
    "eager_quantise_int8",
    "int8_conv",
    "int8_gemm",
    "quantise_int8",
]
