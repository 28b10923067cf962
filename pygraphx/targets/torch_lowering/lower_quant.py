"""Integer quantised products lowered to torch on the CPU, and their quantise / dequantise steps.

- `quant_dot` (int8 x int8 -> int32): `torch._int_mm` (exact int32 accumulation); a constant
  right-hand side broadcast over the batch makes the whole batch one GEMM, a run-time one is
  one `_int_mm` per batch entry.
- `quant_convolution` (2-D, int8 or uint8 input with an optional constant zero point, constant
  int8 weights, symmetric padding): oneDNN's int8 convolution
  (`torch.ops.onednn.qconv2d_pointwise`, weights packed once at prepare), which takes the
  zero point itself (padding is zero in real terms, as the op defines). oneDNN takes unsigned
  activations, so an int8 input is shifted by 128 (a bit flip) with its zero point plus 128,
  which gives the same integer sums. It returns the int32 sums through float32:
  exact up to 2**24 in magnitude, rounded to float32's precision (relative 6e-8) beyond.
- `quantizelinear` (float32 -> int8/uint8, saturating) and `dequantizelinear` (int8/uint8/int32
  -> float32), with or without zero points: the reference's arithmetic (float32 divide, round
  half to even, add the zero point, clamp; subtract the zero point exactly, float32 multiply),
  element for element.

Anything else is declined: the numpy fallback runs it (exact; counted in `fallbacks`), and for
the integer products a warning is logged. Other devices are declined too (the GPU target has
its own plans for these).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, STANDARD, LoweringContext
from pygraphx.targets.torch_lowering.conv_epilogue_match import match_epilogue
from pygraphx.targets.torch_lowering.registry import Fuser, defer, deferred_producer, lowering

log = logging.getLogger(__name__)

_INT8 = ("int8_type",)
_EIGHT_BIT = ("int8_type", "uint8_type")


def _emit_fresh(
    ctx: LoweringContext,
    ins: Instruction,
    produce: Callable[[], torch.Tensor],
    layout: str = STANDARD,
    producers: list[Instruction] | None = None,
) -> bool:
    """Bind `ins` to a tensor its step allocates (standard or channels-last strides); a
    `producers` deferred into the step are listed with it (their inputs stay alive until then)."""
    idx = ctx.bind_dynamic(ins, layout)
    ctx.mark_fresh(idx)
    env = ctx.env

    def step() -> None:
        env[idx] = produce()

    ctx.emit(step, [*(producers or []), ins], idx)
    return True


def _on_cpu(ctx: LoweringContext) -> bool:
    return ctx.device.type == "cpu"


def _decline(ins: Instruction, why: str) -> bool:
    """Announce that an integer product runs through numpy (exact, but slow), and decline."""
    log.warning(
        "%s %s -> %s: no torch integer kernel (%s); it runs through numpy (exact, slow)",
        ins.op.name,
        [x.shape.lens() for x in ins.inputs],
        ins.shape.lens(),
        why,
    )
    return False


@lowering("quant_dot")
def lower_quant_dot(ctx: LoweringContext, ins: Instruction) -> bool:
    if not _on_cpu(ctx):
        return False
    if any(x.shape.type() not in _INT8 for x in ins.inputs):
        return _decline(ins, "only int8 x int8 runs as torch._int_mm")
    env = ctx.env
    a, b = ctx.args(ins)
    out_lens = tuple(ins.shape.lens())
    int_mm = torch._int_mm
    w = _fixed_matrix(ctx, ins)
    if w is not None:
        k, n = w.shape
        rows = ins.shape.elements() // n if n else 0
        if rows == 0 or k == 0:
            return _decline(ins, "an empty product")
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


def channel_vector(
    ctx: LoweringContext,
    ins: Instruction,
    k: int,
    channels: int | None = None,
    any_float: bool = False,
    axis: int = 1,
    ndim: int | None = 4,
) -> torch.Tensor | None:
    """Input k of `ins` as a float32 vector when it is a constant that varies along `axis`
    only (of `channels` entries when given) and has `ndim` dimensions (any when None); float32
    only unless `any_float` (half or bf16 values convert to float32 exactly)."""
    if id(ins.inputs[k]) not in ctx.index:
        return None  # not bound yet (comes after the producer)
    t = ctx.constant(ctx.arg(ins, k))
    if t is None or (ndim is not None and t.dim() != ndim) or t.dim() <= axis % max(t.dim(), 1):
        return None
    ax = axis % t.dim()
    if channels is not None and t.shape[ax] != channels:
        return None
    if t.dtype != torch.float32 and not (any_float and t.dtype.is_floating_point):
        return None
    if any(
        st != 0
        for a, (st, n) in enumerate(zip(t.stride(), t.shape, strict=True))
        if a != ax and n > 1
    ):
        return None
    index = tuple(slice(None) if a == ax else 0 for a in range(t.dim()))
    return t[index].to(torch.float32).contiguous()


def _dequantising_user(ctx: LoweringContext, ins: Instruction) -> tuple[Instruction, Any] | None:
    """(the user, its per-channel scale) when `ins`'s only user is a dequantizelinear of it."""
    if len(ins.outputs) != 1:
        return None
    user = ins.outputs[0]
    if user.op.name != "dequantizelinear" or len(user.inputs) != 2 or user.inputs[0] is not ins:
        return None
    scale = channel_vector(ctx, user, 1)
    return None if scale is None else (user, scale)


@lowering("quant_convolution")
def lower_quant_convolution(ctx: LoweringContext, ins: Instruction) -> bool:
    """oneDNN int8 convolution; fused with its dequantizelinear user when it has one (the
    scales applied by oneDNN to the int32 sums, float32 channels-last output)."""
    op = ins.op
    x, w = ins.inputs[:2]
    if not _on_cpu(ctx):
        return False
    if x.shape.type() not in _EIGHT_BIT or w.shape.type() not in _INT8:
        return _decline(ins, "oneDNN's path here takes int8/uint8 input and int8 weights")
    weights = ctx.constant(ctx.arg(ins, 1))
    zero_point = _input_zero_point(ctx, ins)
    if weights is None or x.shape.ndim() != 4 or op.padding_mode != 0 or zero_point is None:
        return _decline(ins, "needs 2-D, constant weights and zero point, explicit padding")
    pads = list(op.padding)
    if len(pads) == 4:
        if pads[:2] != pads[2:]:
            return _decline(ins, f"asymmetric padding {pads}")
        pads = pads[:2]
    geometry = (list(op.stride), pads, list(op.dilation), op.group)
    fused = _dequantising_user(ctx, ins)
    channels = w.shape.lens()[0]
    scale = fused[1] if fused is not None else torch.ones(channels, dtype=torch.float32)
    signed = x.shape.type() == "int8_type"
    zp = zero_point + 128 if signed else zero_point  # int8 inputs are shifted to uint8
    packed = torch.ops.onednn.qconv_prepack(
        weights.contiguous(), scale, 1.0, zp, *geometry, x.shape.lens()
    )
    input_ = (ctx.arg(ins, 0), zp, signed)
    run = _qconv_runner(ctx, input_, packed, scale, geometry, fused is None)
    fuser = _dequantise_fuser(ins, (input_, packed, scale, geometry), run)
    if fused is not None and defer(ctx, ins, fused[0], fuser):
        return True
    if fused is not None:  # something runs in between: the int32 sums, then the dequantise
        scale = torch.ones(channels, dtype=torch.float32)
        packed = torch.ops.onednn.qconv_prepack(
            weights.contiguous(), scale, 1.0, zp, *geometry, x.shape.lens()
        )
        run = _qconv_runner(ctx, input_, packed, scale, geometry, True)
    return _emit_fresh(ctx, ins, run, CHANNELS_LAST)


def _dequantise_fuser(
    conv: Instruction, call: tuple, run: Callable[[], torch.Tensor]
) -> Callable[[LoweringContext, Instruction], bool]:
    """What lowers the dequantizelinear a quant convolution is deferred into: deferred once
    more into its only user when that is a pointwise bias add and ReLU (`match_epilogue`), so
    oneDNN applies the scales, the bias and the ReLU in one call (float32 output); else the
    convolution with its scales (`run`) alone."""

    def at_dequantise(ctx: LoweringContext, dq: Instruction) -> bool:
        user = dq.outputs[0] if len(dq.outputs) == 1 else None
        if user is not None and user.op.name == "pointwise" and defer(ctx, dq, user, at_epilogue):
            return True
        return _emit_fresh(ctx, dq, run, CHANNELS_LAST, [conv])

    def at_epilogue(ctx: LoweringContext, user: Instruction) -> bool:
        dq = deferred_producer(ctx, user)
        epi = match_epilogue(ctx, dq, user)
        if epi is None or epi.other is not None or epi.unary not in ("none", "relu"):
            _emit_fresh(ctx, dq, run, CHANNELS_LAST, [conv])
            return False  # the pointwise step is lowered as usual, after the convolution
        epilogue = (torch.from_numpy(epi.bias) if epi.bias.any() else None, epi.unary)
        fused = _qconv_runner(ctx, *call, False, epilogue)
        quant = user.outputs[0] if len(user.outputs) == 1 else None
        if _requantises(quant) and defer(ctx, user, quant, at_quantise(epilogue, fused)):
            return True
        return _emit_fresh(ctx, user, fused, CHANNELS_LAST, [conv, dq])

    def at_quantise(epilogue: tuple, fused: Callable[[], torch.Tensor]) -> Fuser:
        """The quantizelinear after the epilogue: oneDNN writes the 8-bit values itself
        (rounding to nearest even and saturating, as quantizelinear does)."""

        def lower(ctx: LoweringContext, quant: Instruction) -> bool:
            user = deferred_producer(ctx, quant)
            dq = deferred_producer(ctx, user)
            scale = _one_value(ctx, quant, 1)
            if scale is None:
                _emit_fresh(ctx, user, fused, CHANNELS_LAST, [conv, dq])
                return False
            dtype = torch.int8 if quant.shape.type() == "int8_type" else torch.uint8
            output = (float(scale), 0, dtype)
            direct = _qconv_runner(ctx, *call, False, epilogue, output)
            return _emit_fresh(ctx, quant, direct, CHANNELS_LAST, [conv, dq, user])

        return lower

    return at_dequantise


#: whether a quant convolution's bias / ReLU epilogue and the symmetric quantizelinear after it
#: run inside oneDNN's call (8-bit output; oneDNN's rounding of the rescaled value may differ
#: from the separate steps' by one step at a tie); False for the separate steps (A/B timing)
DIRECT_REQUANTISE = True


def _requantises(quant: Instruction | None) -> bool:
    """Whether oneDNN may write `quant`'s values: a symmetric (no zero point: the ONNX QDQ
    models' asymmetric ones keep the exact separate step) 8-bit quantizelinear."""
    return (
        DIRECT_REQUANTISE
        and quant is not None
        and quant.op.name == "quantizelinear"
        and len(quant.inputs) == 2
        and quant.shape.type() in _EIGHT_BIT
    )


def _input_zero_point(ctx: LoweringContext, ins: Instruction) -> int | None:
    """The input's zero point (0 without a third input; None when it is not a constant)."""
    if len(ins.inputs) < 3:
        return 0
    t = ctx.constant(ctx.arg(ins, 2))
    return None if t is None else int(t.reshape(-1)[0])


def _qconv_runner(
    ctx: LoweringContext,
    input_: tuple[int, int, bool],
    packed: Any,
    scale: torch.Tensor,
    geometry: tuple,
    sums: bool,
    epilogue: tuple[torch.Tensor | None, str] = (None, "none"),
    output: tuple[float, int, torch.dtype] = (1.0, 0, torch.float32),
) -> Callable[[], torch.Tensor]:
    """The oneDNN call on input (env index, zero point, is it int8): int32 sums when `sums`,
    else the sums times `scale` per channel, plus the (bias, unary op) `epilogue`, written as
    `output` (scale, zero point, dtype: float32 as it is, 8-bit values quantised)."""
    bias, unary = epilogue
    out_scale, out_zero, out_dtype = output
    conv, env = torch.ops.onednn.qconv2d_pointwise, ctx.env
    xi, zp, signed = input_
    stride, pads, dilation, group = geometry
    zeros = torch.zeros(scale.numel(), dtype=torch.int64)
    cl = torch.channels_last

    def run() -> torch.Tensor:
        x = env[xi].contiguous(memory_format=cl)
        if signed:  # oneDNN takes unsigned activations: int8 v -> uint8 v + 128 (a bit flip)
            x = x.view(torch.uint8).bitwise_xor(128)
        y = conv(
            x,
            1.0,
            zp,
            packed,
            scale,
            zeros,
            bias,
            stride,
            pads,
            dilation,
            group,
            out_scale,
            out_zero,
            out_dtype,
            unary,
            [],
            "",
        )
        return y.to(torch.int32) if sums else y

    return run


def _one_value(ctx: LoweringContext, ins: Instruction, k: int) -> torch.Tensor | None:
    """Input k of `ins` as a 0-d tensor when it is a constant broadcast of one value (a
    per-tensor scale or zero point): dividing by it keeps the input's layout and avoids
    reading a broadcast view element by element."""
    t = ctx.constant(ctx.arg(ins, k))
    if t is None or any(st != 0 for st, n in zip(t.stride(), t.shape, strict=True) if n > 1):
        return None
    return t.reshape(-1)[:1].reshape(()).clone()


@lowering("quantizelinear")
def lower_quantizelinear(ctx: LoweringContext, ins: Instruction) -> bool:
    x, s = ins.inputs[:2]
    out = ins.shape.type()
    if out not in _EIGHT_BIT:
        return False
    if x.shape.type() != "float_type" or s.shape.type() != "float_type":
        return False
    lo, hi = (-128, 127) if out == "int8_type" else (0, 255)
    dtype = torch.int8 if out == "int8_type" else torch.uint8
    env = ctx.env
    xi, si = ctx.args(ins)[:2]
    zi = ctx.arg(ins, 2) if len(ins.inputs) == 3 else None
    scale = _one_value(ctx, ins, 1)
    zero = _one_value(ctx, ins, 2) if zi is not None else None

    def run() -> torch.Tensor:
        q = torch.div(env[xi], env[si] if scale is None else scale)
        q.round_()  # half to even, as the reference
        if zi is not None:
            q += env[zi].to(torch.float32) if zero is None else zero.to(torch.float32)
        return q.nan_to_num_(nan=lo).clamp_(lo, hi).to(dtype)

    return _emit_fresh(ctx, ins, run, ctx.layout[xi])


@lowering("dequantizelinear")
def lower_dequantizelinear(ctx: LoweringContext, ins: Instruction) -> bool:
    x, s = ins.inputs[:2]
    if x.shape.type() not in (*_EIGHT_BIT, "int32_type") or s.shape.type() != "float_type":
        return False
    env = ctx.env
    xi, si = ctx.args(ins)[:2]
    zi = ctx.arg(ins, 2) if len(ins.inputs) == 3 else None
    scale = _one_value(ctx, ins, 1)

    def run() -> torch.Tensor:
        s = env[si] if scale is None else scale
        if zi is None:
            return torch.mul(env[xi].to(torch.float32), s)
        shifted = env[xi].to(torch.int64) - env[zi].to(torch.int64)
        return torch.mul(shifted.to(torch.float32), s)

    return _emit_fresh(ctx, ins, run, ctx.layout[xi])
