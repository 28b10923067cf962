"""Handlers of ONNX convolutions: Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv and
CausalConvWithState.

`auto_pad` is resolved here into explicit begin/end padding from the static input shape, so the
IR's `convolution` / `deconvolution` always carry numbers (`padding_mode=0`), as MIGraphX's
parser does for static shapes. A bias becomes `broadcast` (axis 1) + `add` after the convolution,
which later passes fuse. The integer forms subtract zero points in int32 and run an int32
`convolution`; QLinearConv then requantises with pointwise ops.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.broadcast import Broadcast
from pygraphx.ops.conv import Convolution, Deconvolution, DeformConvolution
from pygraphx.ops.pointwise import Clip, Convert
from pygraphx.ops.spatial import dilated, same_padding

Args = list[Instruction | None]
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def spatial_rank(ctx: NodeContext, x: Instruction) -> int:
    """Number of spatial dims of an N x C x D1... input (error below rank 3)."""
    if x.shape.ndim() < 3:
        raise ctx.error(f"input must be N x C x D1 x ... (rank >= 3), got lens {x.shape.lens()}")
    return x.shape.ndim() - 2


def spatial_attr(ctx: NodeContext, name: str, nd: int, default: int) -> tuple[int, ...]:
    """A per-spatial-dim attribute (strides, dilations, ...) with `nd` values."""
    values = tuple(ctx.attr(name, (default,) * nd))
    if len(values) != nd:
        raise ctx.error(f"attribute {name}={list(values)} needs {nd} values (one per spatial dim)")
    return values


def auto_pads(
    ctx: NodeContext, lens: Sequence[int], spans: Sequence[int], strides: Sequence[int]
) -> tuple[int, ...]:
    """ONNX `pads` (begin values, then end values) after resolving `auto_pad`."""
    nd = len(lens)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad not in AUTO_PADS:
        raise ctx.error(f"auto_pad {auto_pad!r} is not one of {', '.join(AUTO_PADS)}")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = same_padding(lens, spans, strides, lower=auto_pad == "SAME_LOWER")
        return (*begin, *end)
    if auto_pad == "VALID":
        return (0,) * (2 * nd)
    pads = tuple(ctx.attr("pads", (0,) * (2 * nd)))
    if len(pads) != 2 * nd:
        raise ctx.error(f"pads {list(pads)} needs {2 * nd} values (begins, then ends)")
    if any(p < 0 for p in pads):
        raise ctx.error(f"pads {list(pads)} must not be negative")
    return pads


def check_kernel_shape(ctx: NodeContext, w: Instruction) -> list[int]:
    """The kernel's spatial lens, checked against the optional `kernel_shape` attribute."""
    kernel = w.shape.lens()[2:]
    given = ctx.attr("kernel_shape", None)
    if given is not None and list(given) != kernel:
        raise ctx.error(f"kernel_shape {list(given)} does not match the weights' lens {kernel}")
    return kernel


def add_channel_bias(ctx: NodeContext, y: Instruction, bias: Instruction | None) -> Instruction:
    """y + bias[c] with the bias broadcast along axis 1 (skipped when there is no bias)."""
    if bias is None:
        return y
    if bias.shape.lens() != [y.shape.lens()[1]]:
        raise ctx.error(
            f"bias lens {bias.shape.lens()} must be [{y.shape.lens()[1]}] (the output channels)"
        )
    b = ctx.add(Broadcast(axis=1, out_lens=tuple(y.shape.lens())), bias)
    return ctx.add(make_op("add"), y, b)


def _optional(args: Args, k: int) -> Instruction | None:
    return args[k] if len(args) > k else None


def _convolution(ctx: NodeContext, x: Instruction, w: Instruction) -> Instruction:
    nd = spatial_rank(ctx, x)
    kernel = check_kernel_shape(ctx, w)
    strides = spatial_attr(ctx, "strides", nd, 1)
    dilations = spatial_attr(ctx, "dilations", nd, 1)
    spans = [dilated(k, d) for k, d in zip(kernel, dilations, strict=True)]
    pads = auto_pads(ctx, x.shape.lens()[2:], spans, strides)
    op = Convolution(padding=pads, stride=strides, dilation=dilations, group=ctx.attr("group", 1))
    return ctx.add(op, x, w)


@onnx_op("Conv")
def parse_conv(ctx: NodeContext, args: Args) -> Instruction:
    y = _convolution(ctx, args[0], args[1])
    return add_channel_bias(ctx, y, _optional(args, 2))


@onnx_op("ConvTranspose")
def parse_conv_transpose(ctx: NodeContext, args: Args) -> Instruction:
    x, w = args[0], args[1]
    nd = spatial_rank(ctx, x)
    kernel = check_kernel_shape(ctx, w)
    strides = spatial_attr(ctx, "strides", nd, 1)
    dilations = spatial_attr(ctx, "dilations", nd, 1)
    out_pad = spatial_attr(ctx, "output_padding", nd, 0)
    lens = x.shape.lens()[2:]
    # the full result's lens, output_padding included
    full = [
        (n - 1) * s + dilated(k, d) + p
        for n, s, k, d, p in zip(lens, strides, kernel, dilations, out_pad, strict=True)
    ]
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    out_shape = ctx.attr("output_shape", None)
    if out_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape is None:
            target = [n * s for n, s in zip(lens, strides, strict=True)]
        else:
            if len(out_shape) not in (nd, nd + 2):
                raise ctx.error(f"output_shape {list(out_shape)} needs {nd} spatial values")
            target = list(out_shape)[-nd:]
        # total padding split as the ONNX spec says: the odd one goes first unless SAME_UPPER
        total = [f - t for f, t in zip(full, target, strict=True)]
        upper = auto_pad == "SAME_UPPER"
        begin = [t // 2 if upper else t - t // 2 for t in total]
        end = [t - b for t, b in zip(total, begin, strict=True)]
    else:
        pads = auto_pads(ctx, lens, [1] * nd, [1] * nd)  # NOTSET / VALID only
        begin, end = list(pads[:nd]), list(pads[nd:])
    # the IR op crops its result without output_padding: less (or negative) end padding
    end = [e - p for e, p in zip(end, out_pad, strict=True)]
    op = Deconvolution(
        padding=(*begin, *end), stride=strides, dilation=dilations, group=ctx.attr("group", 1)
    )
    y = ctx.add(op, x, w)
    return add_channel_bias(ctx, y, _optional(args, 2))


def _minus_zero_point(
    ctx: NodeContext, x: Instruction, zp: Instruction | None, axis: int
) -> Instruction:
    """int32(x) - int32(zero_point); a 1-D zero point is per index of `axis`."""
    x32 = ctx.convert(x, "int32_type")
    if zp is None:
        return x32
    z = ctx.convert(zp, "int32_type")
    if z.shape.elements() == 1:
        z = ctx.broadcast(z, x32)[0]
    elif z.shape.ndim() == 1 and z.shape.lens()[0] == x32.shape.lens()[axis]:
        z = ctx.add(Broadcast(axis=axis, out_lens=tuple(x32.shape.lens())), z)
    else:
        raise ctx.error(
            f"zero point lens {zp.shape.lens()} must be a scalar or per-channel "
            f"[{x32.shape.lens()[axis]}]"
        )
    return ctx.add(make_op("sub"), x32, z)


@onnx_op("ConvInteger", since=10)
def parse_conv_integer(ctx: NodeContext, args: Args) -> Instruction:
    x = _minus_zero_point(ctx, args[0], _optional(args, 2), 1)
    w = _minus_zero_point(ctx, args[1], _optional(args, 3), 0)
    return _convolution(ctx, x, w)


def _per_channel(ctx: NodeContext, v: Instruction, like: Instruction) -> Instruction:
    """A scalar or per-output-channel (axis 1) value broadcast to `like`'s lens."""
    if v.shape.ndim() == 1 and v.shape.elements() == like.shape.lens()[1] > 1:
        return ctx.add(Broadcast(axis=1, out_lens=tuple(like.shape.lens())), v)
    return ctx.broadcast(v, like)[0]


@onnx_op("QLinearConv", since=10)
def parse_qlinear_conv(ctx: NodeContext, args: Args) -> Instruction:
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = (_optional(args, k) for k in range(8))
    acc = _convolution(ctx, _minus_zero_point(ctx, x, x_zp, 1), _minus_zero_point(ctx, w, w_zp, 0))
    acc = add_channel_bias(ctx, acc, _optional(args, 8))
    # requantise: saturate(round(acc * x_scale * w_scale / y_scale) + y_zp), in float32
    mul, out_type = make_op("mul"), args[0].shape.type()
    if y_zp is not None:
        out_type = y_zp.shape.type()
    accf = ctx.convert(acc, "float_type")
    scale = ctx.add(mul, *ctx.broadcast(ctx.convert(x_scale, "float_type"), w_scale))
    scale = ctx.add(make_op("div"), *ctx.broadcast(scale, ctx.convert(y_scale, "float_type")))
    y = ctx.add(make_op("round"), ctx.add(mul, accf, _per_channel(ctx, scale, accf)))
    if y_zp is not None:
        y = ctx.add(make_op("add"), *ctx.broadcast(y, ctx.convert(y_zp, "float_type")))
    lo, hi = (0, 255) if out_type == "uint8_type" else (-128, 127)
    y = ctx.add(Clip(), y, ctx.scalar(lo, y), ctx.scalar(hi, y))
    return ctx.add(Convert(out_type), y)


@onnx_op("DeformConv", since=19)
def parse_deform_conv(ctx: NodeContext, args: Args) -> Instruction:
    x, w, offset = args[:3]
    nd = spatial_rank(ctx, x)
    check_kernel_shape(ctx, w)
    op = DeformConvolution(
        padding=tuple(ctx.attr("pads", (0,) * (2 * nd))),
        stride=spatial_attr(ctx, "strides", nd, 1),
        dilation=spatial_attr(ctx, "dilations", nd, 1),
        group=ctx.attr("group", 1),
        offset_group=ctx.attr("offset_group", 1),
    )
    mask = _optional(args, 4)
    y = ctx.add(op, x, w, offset, *([mask] if mask is not None else []))
    return add_channel_bias(ctx, y, _optional(args, 3))


@onnx_op("CausalConvWithState", since=27)
def parse_causal_conv_with_state(ctx: NodeContext, args: Args) -> list[Instruction]:
    # concat(past_state or zeros, input) -> depthwise conv -> bias -> activation; the new state
    # is the last k - 1 steps of the concatenation
    x, w, bias, past = (_optional(args, k) for k in range(4))
    if x.shape.ndim() != 3 or w.shape.ndim() != 3 or w.shape.lens()[:2] != [x.shape.lens()[1], 1]:
        raise ctx.error(
            f"needs input (B, C, L) and depthwise weights (C, 1, k), got {x.shape.lens()} and "
            f"{w.shape.lens()}"
        )
    batch, channels, _ = x.shape.lens()
    k = w.shape.lens()[2]
    if past is None:
        zero = ctx.literal(np.zeros((), dtype=x.shape.dtype()))
        past = ctx.broadcast_to(zero, [batch, channels, k - 1])
    padded = ctx.add(make_op("concat", axis=2), past, x)
    y = ctx.add(Convolution(padding=(0, 0), stride=(1,), dilation=(1,), group=channels), padded, w)
    y = add_channel_bias(ctx, y, bias)
    activation = ctx.attr("activation", "none")
    if activation in ("silu", "swish"):
        yf = ctx.convert(y, "float_type")
        y = ctx.convert(
            ctx.add(make_op("mul"), yf, ctx.add(make_op("sigmoid"), yf)), y.shape.type()
        )
    elif activation != "none":
        raise ctx.error(f"activation {activation!r} is not one of none, silu, swish")
    total = padded.shape.lens()[2]
    state = ctx.add(make_op("slice", axes=(2,), starts=(total - k + 1,), ends=(total,)), padded)
    return [y, state]
