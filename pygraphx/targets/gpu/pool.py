"""2-D max pooling of a channels-last tensor on the gpu target, as one Triton kernel.

`max_pool_nhwc(x, out, kernel, stride, pads)`: `out[n, c, ho, wo]` = the largest
`x[n, c, ho * sh - ph + i, wo * sw - pw + j]` over the window's positions inside the input
(positions in the padding take no part, as in `F.max_pool2d`), NaN if any of them is NaN.
Both tensors are dense channels-last (NHWC in memory): each program reads a block of output
pixels times a block of channels, the channels contiguous, one load per window position.

Why: torch's channels-last half max pool took 0.120 ms for ResNet-50's stem pool at batch 32
(`[32, 64, 112, 112] -> 56x56`, H100, `benchmarks/results/h100_quant_gpu_resnet50_b32_session6
.txt`) where its bytes (51 MB read, 13 MB written) take about 20 us at the H100's bandwidth;
this kernel took 0.024 ms against torch's 0.118 on an H200 (`benchmarks/resgpu_probe.py`,
`benchmarks/results/h200_resgpu_probe.json`).
The maximum is exact in any type, so the result is torch's bit for bit. When the pool's only
user is an int8 or fp8 `quantizelinear` with one constant scale (ResNet's stem pool feeds the
first block's convolutions), the kernel writes that quantised tensor too, and the float one
only if something else reads it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pygraphx.codegen.triton.quantise import MAGIC, fp8_of_quotient, int8_of_quotient, quotient
from pygraphx.targets.gpu import quantise_kernels as qe

__all__ = ["max_pool_nhwc", "pool_fits"]

_BLOCK_P = 32


@triton.jit
def _max_pool_kernel(
    x_ptr, out_ptr, P, C, H, W, HO, WO, sxn, sxh, sxw, son, soh, sow, SH, SW, PH, PW,
    qs_ptr, q_ptr, KH: tl.constexpr, KW: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr, STORE: tl.constexpr, QUANT: tl.constexpr, MAGIC: tl.constexpr,
    CAST: tl.constexpr,
):  # fmt: skip
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    chan = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    wo = pix % WO
    ho = (pix // WO) % HO
    n = pix // (WO * HO)
    live = (pix < P)[:, None] & (chan < C)[None, :]
    h0, w0 = ho * SH - PH, wo * SW - PW
    acc = tl.full((BLOCK_P, BLOCK_C), float("-inf"), tl.float32)
    for i in tl.static_range(KH):
        for j in tl.static_range(KW):
            hi, wi = h0 + i, w0 + j
            inside = (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            at = n * sxn + hi * sxh + wi * sxw
            v = tl.load(
                x_ptr + at[:, None] + chan[None, :], mask=live & inside[:, None],
                other=float("-inf"),
            )  # fmt: skip
            acc = tl.maximum(acc, v.to(tl.float32), propagate_nan=tl.PropagateNan.ALL)
    at = (n * son + ho * soh + wo * sow)[:, None] + chan[None, :]
    y = acc.to(out_ptr.dtype.element_ty)
    if STORE:
        tl.store(out_ptr + at, y, mask=live)
    if QUANT != 0:  # `quantise_kernels.quantise_int8` / `quantise_fp8` of the stored value
        yq = y.to(tl.float32)
        qs = tl.load(qs_ptr).to(tl.float32)
        v = quotient(yq, qs, tl.math.div_rn(1.0, qs))
        if QUANT == 1:
            q = int8_of_quotient(v, yq, MAGIC)
        else:  # fp8 e4m3fn, its bytes
            q = fp8_of_quotient(v, yq, qs, MAGIC, CAST)
        tl.store(q_ptr + at, q, mask=live)


def pool_fits(x_lens: list[int], kernel, stride, pads, dilation) -> bool:
    """Whether `max_pool_nhwc` computes this 2-D max pool: dilation 1, each pad at most half
    its window (so no window lies wholly in the padding), a 4-D input."""
    if len(x_lens) != 4 or len(kernel) != 2 or any(d != 1 for d in dilation):
        return False
    return all(0 <= 2 * p <= k for p, k in zip(pads, kernel, strict=True)) and min(stride) >= 1


def max_pool_nhwc(
    x: torch.Tensor,
    out: torch.Tensor,
    kernel: tuple,
    stride: tuple,
    pads: tuple,
    quantise: tuple[torch.Tensor, torch.Tensor, bool] | None = None,
) -> None:
    """`out` = the max pool of `x` (both (N, C, H, W) shaped, dense channels-last, one float
    type) with window `kernel`, `stride` and begin `pads` (module docstring). `quantise` =
    (one-element float32 scale, `qout` int8 or fp8 e4m3fn laid out as `out`, whether `out`
    is written too): `qout` takes the quantise of the pooled value, bit for bit
    `quantise_kernels.quantise_int8` / `quantise_fp8` of `out` (no separate pass over it)."""
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
    qs, q, store = quantise if quantise is not None else (out, out, True)
    kind = 0 if quantise is None else (1 if q.dtype == torch.int8 else 2)
    if kind and (q.stride() != out.stride() or q.dtype not in (torch.int8, torch.float8_e4m3fn)):
        raise ValueError(
            f"max_pool_nhwc: int8 or fp8 quantised output laid out as out, got {q.dtype}"
        )
    cast = kind == 2 and qe.fp8_cast(q.device)
    _max_pool_kernel[grid](
        x, out, p, c, h, w, ho, wo, sxn, sxh, sxw, son, soh, sow, *stride, *pads,
        qs, q.view(torch.uint8) if kind == 2 else q, KH=kernel[0], KW=kernel[1],
        BLOCK_P=_BLOCK_P, BLOCK_C=block_c, STORE=store, QUANT=kind, MAGIC=MAGIC, CAST=cast,
        num_warps=4,
    )  # fmt: skip


def _dense_nhwc(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last) and t.stride(1) == 1
