"""Integer quantised products lowered to torch on the CPU, and their quantise / dequantise steps.

- `quant_dot` (int8 x int8 -> int32): `torch._int_mm` (exact int32 accumulation); a constant
  right-hand side broadcast over the batch makes the whole batch one GEMM, a run-time one is
  one `_int_mm` per batch entry.
- `quant_convolution` (2-D, int8 input and constant int8 weights, symmetric padding): oneDNN's
  int8 convolution (`torch.ops.onednn.qconv2d_pointwise`, weights packed once at prepare).
  oneDNN takes unsigned activations, so the input is shifted by 128 (a bit flip) with zero
  point 128, which gives the same integer sums. It returns the int32 sums through float32:
  exact up to 2**24 in magnitude, rounded to float32's precision (relative 6e-8) beyond.
- `quantizelinear` (float32 -> int8/uint8) and `dequantizelinear` (int8/uint8/int32 -> float32)
  without zero points: the reference's arithmetic (float32 divide, round half to even, clamp;
  float32 multiply), element for element.

Anything else is declined (the numpy fallback runs it and is counted in `fallbacks`). Other
devices are declined too (the GPU target has its own plans for these).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.registry import lowering

_INT8 = ("int8_type",)
_EIGHT_BIT = ("int8_type", "uint8_type")


def _emit_fresh(
    ctx: LoweringContext, ins: Instruction, produce: Callable[[], torch.Tensor]
) -> bool:
    idx = ctx.bind_dynamic(ins)
    ctx.mark_fresh(idx)
    env = ctx.env

    def step() -> None:
        env[idx] = produce()

    ctx.emit(step, ins, idx)
    return True


def _on_cpu(ctx: LoweringContext) -> bool:
    return ctx.device.type == "cpu"


@lowering("quant_dot")
def lower_quant_dot(ctx: LoweringContext, ins: Instruction) -> bool:
    if not _on_cpu(ctx) or any(x.shape.type() not in _INT8 for x in ins.inputs):
        return False
    env = ctx.env
    a, b = ctx.args(ins)
    out_lens = tuple(ins.shape.lens())
    int_mm = torch._int_mm
    w = _fixed_matrix(ctx, ins)
    if w is not None:
        k, n = w.shape
        rows = ins.shape.elements() // n if n else 0
        if rows == 0 or k == 0:
            return False
        return _emit_fresh(ctx, ins, lambda: int_mm(env[a].reshape(rows, k), w).view(out_lens))
    m, k = ins.inputs[0].shape.lens()[-2:]
    n = out_lens[-1]

    def batched() -> torch.Tensor:
        x, y = env[a].reshape(-1, m, k), env[b].reshape(-1, k, n)
        out = torch.empty((x.shape[0], m, n), dtype=torch.int32)
        for i in range(x.shape[0]):
            out[i] = int_mm(x[i], y[i])
        return out.view(out_lens)

    return _emit_fresh(ctx, ins, batched)


def _fixed_matrix(ctx: LoweringContext, ins: Instruction) -> torch.Tensor | None:
    """The right-hand side as one contiguous (K, N) matrix when it is constant and the same
    for every batch entry."""
    t = ctx.constant(ctx.arg(ins, 1))
    if t is None:
        return None
    lens = ins.inputs[1].shape.lens()
    if t.dim() > 2:
        strides = t.stride()[:-2]
        if any(s != 0 for s, n in zip(strides, lens[:-2], strict=True) if n != 1):
            return None
        t = t[(0,) * (t.dim() - 2)]
    return t.contiguous()


@lowering("quant_convolution")
def lower_quant_convolution(ctx: LoweringContext, ins: Instruction) -> bool:
    op = ins.op
    x, w = ins.inputs
    if not _on_cpu(ctx) or x.shape.type() not in _INT8 or w.shape.type() not in _INT8:
        return False
    weights = ctx.constant(ctx.arg(ins, 1))
    if weights is None or x.shape.ndim() != 4 or op.padding_mode != 0:
        return False
    pads = list(op.padding)
    if len(pads) == 4:
        if pads[:2] != pads[2:]:
            return False
        pads = pads[:2]
    stride, dilation, group = list(op.stride), list(op.dilation), op.group
    channels = w.shape.lens()[0]
    ones = torch.ones(channels, dtype=torch.float32)
    zeros = torch.zeros(channels, dtype=torch.int64)
    packed = torch.ops.onednn.qconv_prepack(
        weights.contiguous(), ones, 1.0, 128, stride, pads, dilation, group, x.shape.lens()
    )
    conv = torch.ops.onednn.qconv2d_pointwise
    env, xi = ctx.env, ctx.arg(ins, 0)

    def run() -> torch.Tensor:
        shifted = env[xi].view(torch.uint8).bitwise_xor(128)  # int8 v -> uint8 v + 128
        y = conv(
            shifted,
            1.0,
            128,
            packed,
            ones,
            zeros,
            None,
            stride,
            pads,
            dilation,
            group,
            1.0,
            0,
            torch.float32,
            "none",
            [],
            "",
        )
        return y.to(torch.int32, memory_format=torch.contiguous_format)

    return _emit_fresh(ctx, ins, run)


@lowering("quantizelinear")
def lower_quantizelinear(ctx: LoweringContext, ins: Instruction) -> bool:
    x, s = ins.inputs[:2]
    out = ins.shape.type()
    if len(ins.inputs) != 2 or out not in _EIGHT_BIT:
        return False
    if x.shape.type() != "float_type" or s.shape.type() != "float_type":
        return False
    lo, hi = (-128, 127) if out == "int8_type" else (0, 255)
    dtype = torch.int8 if out == "int8_type" else torch.uint8
    env = ctx.env
    xi, si = ctx.args(ins)

    def run() -> torch.Tensor:
        q = torch.round(env[xi] / env[si])
        q = torch.nan_to_num(q, nan=lo).clamp_(lo, hi)
        return q.to(dtype, memory_format=torch.contiguous_format)

    return _emit_fresh(ctx, ins, run)


@lowering("dequantizelinear")
def lower_dequantizelinear(ctx: LoweringContext, ins: Instruction) -> bool:
    x, s = ins.inputs[:2]
    if len(ins.inputs) != 2 or x.shape.type() not in (*_EIGHT_BIT, "int32_type"):
        return False
    if s.shape.type() != "float_type":
        return False
    env = ctx.env
    xi, si = ctx.args(ins)

    def run() -> torch.Tensor:
        return torch.mul(env[xi].to(torch.float32), env[si]).contiguous()

    return _emit_fresh(ctx, ins, run)
