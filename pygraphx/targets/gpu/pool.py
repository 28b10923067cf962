"""2-D max pooling of a channels-last tensor on the gpu target, as one Triton kernel.

`max_pool_nhwc(x, out, kernel, stride, pads)`: `out[n, c, ho, wo]` = the largest
`x[n, c, ho * sh - ph + i, wo * sw - pw + j]` over the window's positions inside the input
(positions in the padding take no part, as in `F.max_pool2d`), NaN if any of them is NaN.
Both tensors are dense channels-last (NHWC in memory): each program reads a block of output
pixels times a block of channels, the channels contiguous, one load per window position.
int8 too: the max pool of an int8 quantised tensor is the quantised max pool (quantising is
monotonic), which `quant_epilogue` uses to pool ResNet's stem after its int8 quantise.

Why: torch's channels-last half max pool took 0.120 ms for ResNet-50's stem pool at batch 32
(`[32, 64, 112, 112] -> 56x56`, H100, `benchmarks/results/h100_quant_gpu_resnet50_b32_session6
.txt`) where its bytes (51 MB read, 13 MB written) take about 20 us at the H100's bandwidth.
The maximum is exact in any type, so the result is torch's bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["max_pool_nhwc", "pool_fits"]

_BLOCK_P = 32


@triton.jit
def _max_pool_kernel(
    x_ptr, out_ptr, P, C, H, W, HO, WO, sxn, sxh, sxw, son, soh, sow, SH, SW, PH, PW,
    KH: tl.constexpr, KW: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    INT8: tl.constexpr,
):  # fmt: skip
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    chan = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    wo = pix % WO
    ho = (pix // WO) % HO
    n = pix // (WO * HO)
    live = (pix < P)[:, None] & (chan < C)[None, :]
    h0, w0 = ho * SH - PH, wo * SW - PW
    if INT8:
        acc = tl.full((BLOCK_P, BLOCK_C), -128, tl.int32)
    else:
        acc = tl.full((BLOCK_P, BLOCK_C), float("-inf"), tl.float32)
    for i in tl.static_range(KH):
        for j in tl.static_range(KW):
            hi, wi = h0 + i, w0 + j
            inside = (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            at = x_ptr + (n * sxn + hi * sxh + wi * sxw)[:, None] + chan[None, :]
            if INT8:
                v = tl.load(at, mask=live & inside[:, None], other=-128)
                acc = tl.maximum(acc, v.to(tl.int32))
            else:
                v = tl.load(at, mask=live & inside[:, None], other=float("-inf"))
                acc = tl.maximum(acc, v.to(tl.float32), propagate_nan=tl.PropagateNan.ALL)
    dst = out_ptr + (n * son + ho * soh + wo * sow)[:, None] + chan[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=live)


def pool_fits(x_lens: list[int], kernel, stride, pads, dilation) -> bool:
    """Whether `max_pool_nhwc` computes this 2-D max pool: dilation 1, each pad at most half
    its window (so no window lies wholly in the padding), a 4-D input."""
    if len(x_lens) != 4 or len(kernel) != 2 or any(d != 1 for d in dilation):
        return False
    return all(0 <= 2 * p <= k for p, k in zip(pads, kernel, strict=True)) and min(stride) >= 1


def max_pool_nhwc(
    x: torch.Tensor, out: torch.Tensor, kernel: tuple, stride: tuple, pads: tuple
) -> None:
    """`out` = the max pool of `x` (both (N, C, H, W) shaped, dense channels-last, one float
    type or int8) with window `kernel`, `stride` and begin `pads` (module docstring)."""
    n, c, h, w = x.shape
    ho, wo = out.shape[2:]
    p = n * ho * wo
    if p == 0 or c == 0:
        return
    if not (_dense_nhwc(x) and _dense_nhwc(out)) or x.dtype != out.dtype:
        raise ValueError(
            f"max_pool_nhwc: dense channels-last tensors of one type, got {x.dtype} "
            f"{tuple(x.stride())} and {out.dtype} {tuple(out.stride())}"
        )
    block_c = min(128, triton.next_power_of_2(c))
    grid = (triton.cdiv(p, _BLOCK_P), triton.cdiv(c, block_c))
    sxn, _, sxh, sxw = x.stride()
    son, _, soh, sow = out.stride()
    _max_pool_kernel[grid](
        x, out, p, c, h, w, ho, wo, sxn, sxh, sxw, son, soh, sow, *stride, *pads,
        KH=kernel[0], KW=kernel[1], BLOCK_P=_BLOCK_P, BLOCK_C=block_c,
        INT8=x.dtype == torch.int8, num_warps=4,
    )  # fmt: skip


def _dense_nhwc(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last) and t.stride(1) == 1
