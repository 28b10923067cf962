"""Handlers of ONNX linear quantisation: QuantizeLinear, DequantizeLinear and
DynamicQuantizeLinear.

One handler covers every version of (De)QuantizeLinear: the versions add attributes (axis at 13,
saturate at 19, block_size and output_dtype at 21/23, precision at 23) whose defaults give the
older behaviour. The scale and zero point are laid out to the input's lens with broadcast views
(per tensor: `multibroadcast`; per axis: `broadcast` at the axis; blocked: each scale repeated
`block_size` times along the axis with unsqueeze -> multibroadcast -> reshape -> slice, the last
block possibly short), then the element-wise IR ops `quantizelinear` / `dequantizelinear` run.

The 4-bit, 2-bit, fp4/fp6 and e8m0 types have no pygraphx shape type, so models using them are
rejected with the type named. `precision` (opset 23) converts x and the scale to that type; a
float16/bf16 quotient is rounded to that type before it is quantised, as ONNX specifies (without
`precision`, x / scale is computed in float32 whatever their types, as ONNX Runtime does).

DynamicQuantizeLinear is decomposed as its ONNX function body, with ONNX Runtime's guard for an
all-zero input: `scale = (max(x, 0) - min(x, 0)) / 255`, or 1 when that range is 0 (ONNX's
reference gives 1/255 there; the quantised values are 0 either way),
`zero_point = rint(clip(-min(x, 0) / scale, 0, 255))`, `y = quantizelinear(x, scale, zero_point)`.
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.shape import FLOAT_TYPES
from pygraphx.onnx.context import NodeContext, onnx_type_to_shape_type
from pygraphx.onnx.handlers.layout import arg
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.broadcast import Broadcast, Multibroadcast
from pygraphx.ops.layout import Reshape, Slice, Unsqueeze
from pygraphx.ops.pointwise import Clip, Where
from pygraphx.ops.quant import QUANT_TYPES, DequantizeLinear, QuantizeLinear
from pygraphx.ops.reduce import ReduceMax, ReduceMin

Args = list[Instruction | None]


def _type_attr(ctx: NodeContext, name: str) -> str | None:
    """A TensorProto type attribute as a shape type name (None when absent or 0)."""
    value = ctx.attr(name, 0)
    if not value:
        return None
    try:
        return onnx_type_to_shape_type(value)
    except ValueError as exc:
        raise ctx.error(f"attribute {name}: {exc}") from None


def layout_param(
    ctx: NodeContext, param: Instruction, x: Instruction, axis: int, block_size: int, what: str
) -> Instruction:
    """A scale or zero point laid out to `x`'s lens: per tensor, per axis or blocked."""
    lens = x.shape.lens()
    rank = len(lens)
    plens = param.shape.lens()
    if block_size > 0 and param.shape.elements() != 1:
        return _blocked_param(ctx, param, lens, axis, block_size, what)
    if param.shape.elements() == 1:
        if len(plens) > rank:
            param = ctx.add(Reshape(()), param)
        return ctx.broadcast_to(param, lens)
    if len(plens) == 1 and rank >= 1:
        a = _axis(ctx, axis, rank)
        if plens[0] != lens[a]:
            raise ctx.error(
                f"{what} has {plens[0]} values, but axis {axis} of the input {lens} has {lens[a]}"
            )
        return ctx.add(Broadcast(axis=a, out_lens=tuple(lens)), param)
    raise ctx.error(
        f"{what} of shape {plens} is neither a scalar nor a 1-D per-axis tensor for the input "
        f"{lens} (blocked quantisation needs block_size)"
    )


def _axis(ctx: NodeContext, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for an input of rank {rank}")
    return axis + rank if axis < 0 else axis


def _blocked_param(
    ctx: NodeContext, param: Instruction, lens: list[int], axis: int, block: int, what: str
) -> Instruction:
    rank = len(lens)
    a = _axis(ctx, axis, rank)
    plens = param.shape.lens()
    if len(plens) != rank or any(
        p != n for k, (p, n) in enumerate(zip(plens, lens, strict=True)) if k != a
    ):
        raise ctx.error(
            f"blocked {what} of shape {plens} must match the input {lens} except on axis {a}"
        )
    blocks = plens[a]
    if not (blocks - 1) * block < lens[a] <= blocks * block:
        raise ctx.error(
            f"block_size {block} with {blocks} blocks does not cover axis {a} of length {lens[a]}"
        )
    p = ctx.add(Unsqueeze(axes=(a + 1,)), param)
    p = ctx.add(Multibroadcast(tuple(plens[: a + 1] + [block] + plens[a + 1 :])), p)
    p = ctx.add(Reshape(tuple(plens[:a] + [blocks * block] + plens[a + 1 :])), p)
    if blocks * block != lens[a]:
        p = ctx.add(Slice(axes=(a,), starts=(0,), ends=(lens[a],)), p)
    return p


def _check_scale(ctx: NodeContext, scale: Instruction) -> None:
    if scale.shape.type() not in FLOAT_TYPES or scale.shape.type().startswith("fp8"):
        raise ctx.error(f"scale type {scale.shape.type()} is not float, float16 or bfloat16")


@onnx_op("QuantizeLinear", since=10)
def parse_quantizelinear(ctx: NodeContext, args: Args) -> Instruction:
    x, scale, zp = args[0], args[1], arg(args, 2)
    _check_scale(ctx, scale)
    out_type = _type_attr(ctx, "output_dtype")
    if zp is not None:
        if out_type is not None and out_type != zp.shape.type():
            raise ctx.error(
                f"output_dtype {out_type} differs from the zero point's type {zp.shape.type()}"
            )
        out_type = zp.shape.type()
    out_type = out_type or "uint8_type"
    if out_type not in QUANT_TYPES:
        raise ctx.error(
            f"{out_type} is not a quantised type pygraphx supports "
            f"({', '.join(sorted(QUANT_TYPES))})"
        )
    precision = _type_attr(ctx, "precision")
    if precision is not None:
        x, scale = ctx.convert(x, precision), ctx.convert(scale, precision)
    axis, block = ctx.attr("axis", 1), ctx.attr("block_size", 0)
    params = [layout_param(ctx, scale, x, axis, block, "scale")]
    if precision in ("half_type", "bf16_type"):
        # the quotient rounded to the narrow type, then quantised with a scale of 1
        x = ctx.add(make_op("div"), x, params[0])
        params[0] = ctx.scalar(1.0, x)
    if zp is not None:
        params.append(layout_param(ctx, zp, x, axis, block, "zero point"))
    op = QuantizeLinear(out_type=out_type, saturate=bool(ctx.attr("saturate", 1)))
    return ctx.add(op, x, *params)


@onnx_op("DequantizeLinear", since=10)
def parse_dequantizelinear(ctx: NodeContext, args: Args) -> Instruction:
    x, scale, zp = args[0], args[1], arg(args, 2)
    _check_scale(ctx, scale)
    if zp is not None and zp.shape.type() != x.shape.type():
        raise ctx.error(f"zero point type {zp.shape.type()} differs from x's {x.shape.type()}")
    out_type = _type_attr(ctx, "output_dtype")
    if out_type is not None and out_type != scale.shape.type():
        # the product is rounded once to float32, then to the output type (as ONNX's reference)
        scale = ctx.convert(scale, "float_type")
    axis, block = ctx.attr("axis", 1), ctx.attr("block_size", 0)
    params = [layout_param(ctx, scale, x, axis, block, "scale")]
    if zp is not None:
        params.append(layout_param(ctx, zp, x, axis, block, "zero point"))
    y = ctx.add(DequantizeLinear(), x, *params)
    return ctx.convert(y, out_type) if out_type is not None else y


@onnx_op("DynamicQuantizeLinear", since=11)
def parse_dynamic_quantizelinear(ctx: NodeContext, args: Args) -> list[Instruction]:
    x = args[0]
    if x.shape.type() != "float_type":
        raise ctx.error(f"input type {x.shape.type()} is not float")
    rank = x.shape.ndim()
    axes = tuple(range(rank))
    zero = ctx.literal(0.0, x.shape.dtype())
    lo = ctx.add(make_op("min"), *ctx.broadcast(ctx.add(ReduceMin(axes=axes), x), zero))
    hi = ctx.add(make_op("max"), *ctx.broadcast(ctx.add(ReduceMax(axes=axes), x), zero))
    span = ctx.add(make_op("sub"), hi, lo)
    empty = ctx.add(make_op("equal"), span, ctx.scalar(0.0, span))
    scale = ctx.add(make_op("div"), span, ctx.scalar(255.0, span))
    scale = ctx.add(Where(), empty, ctx.scalar(1.0, scale), scale)
    zp = ctx.add(make_op("div"), lo, scale)
    zp = ctx.add(make_op("sub"), ctx.scalar(0.0, zp), zp)
    zp = ctx.add(Clip(), zp, ctx.scalar(0.0, zp), ctx.scalar(255.0, zp))
    zp = ctx.convert(ctx.add(make_op("round"), zp), "uint8_type")
    lens = x.shape.lens()
    y = ctx.add(QuantizeLinear(), x, ctx.broadcast_to(scale, lens), ctx.broadcast_to(zp, lens))
    return [y, ctx.add(Reshape(()), scale), ctx.add(Reshape(()), zp)]
