"""Handlers of ONNX matrix products: MatMul, MatMulInteger, QLinearMatMul and Gemm.

As in MIGraphX's parser, 1-D operands are unsqueezed (A to [1, K], B to [K, 1]) and the extra
axis squeezed from the result, batch dimensions are multibroadcast to their common shape before
`dot` (which requires equal batch dimensions), and Gemm becomes
`dot(transpose?(alpha * A), transpose?(B)) + beta * C` with the multiplications left out when
alpha or beta is 1.
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.shape import to_dtype
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.base import Op, ShapeError
from pygraphx.ops.broadcast import Broadcast, broadcast_lens
from pygraphx.ops.gemm import Dot, QuantDot
from pygraphx.ops.pointwise import Clip

Args = list[Instruction | None]


def add_matmul(ctx: NodeContext, a: Instruction, b: Instruction, op: Op) -> Instruction:
    """`op(a, b)` (a `dot` or `quant_dot`) with numpy's matmul rules for ranks and batches."""
    if a.shape.ndim() == 0 or b.shape.ndim() == 0:
        raise ctx.error(
            f"matrix product of a scalar: input ranks are {a.shape.ndim()} and {b.shape.ndim()}"
        )
    a_vector = a.shape.ndim() == 1
    b_vector = b.shape.ndim() == 1
    if a_vector:
        a = ctx.add(make_op("unsqueeze", axes=(0,)), a)
    if b_vector:
        b = ctx.add(make_op("unsqueeze", axes=(1,)), b)
    al, bl = a.shape.lens(), b.shape.lens()
    if al[-1] != bl[-2]:
        raise ctx.error(
            f"inner dimensions differ: A is {al}, B is {bl} "
            f"(A's last dimension {al[-1]} != B's second-to-last {bl[-2]})"
        )
    try:
        batch = broadcast_lens(al[:-2], bl[:-2])
    except ShapeError:
        raise ctx.error(
            f"batch dimensions {al[:-2]} and {bl[:-2]} cannot be broadcast together"
        ) from None
    a = ctx.broadcast_to(a, batch + al[-2:])
    b = ctx.broadcast_to(b, batch + bl[-2:])
    out = ctx.add(op, a, b)
    rank = len(batch) + 2
    axes = ([rank - 2] if a_vector else []) + ([rank - 1] if b_vector else [])
    if axes:
        out = ctx.add(make_op("squeeze", axes=tuple(axes)), out)
    return out


@onnx_op("MatMul")
def parse_matmul(ctx: NodeContext, args: Args) -> Instruction:
    a, b = args[0], args[1]
    if a.shape.type() != b.shape.type():
        raise ctx.error(f"inputs have different types {a.shape.type()} and {b.shape.type()}")
    return add_matmul(ctx, a, b, Dot())


def _is_zero(ctx: NodeContext, zero_point: Instruction | None) -> bool:
    if zero_point is None:
        return True
    value = ctx.const(zero_point)
    return value is not None and not np.any(value)


def _subtract_zero_point(
    ctx: NodeContext, x: Instruction, zero_point: Instruction | None, per_row: bool
) -> Instruction:
    """`int32(x) - int32(zero_point)`, the zero point broadcast as MatMulInteger defines it.

    A 1-D zero point of A holds one value per row of A (axis -2); of B one per column (the last
    axis, numpy's rule). Higher-rank zero points broadcast with numpy's rules.
    """
    x32 = ctx.convert(x, "int32_type")
    if _is_zero(ctx, zero_point):
        return x32
    if zero_point.shape.type() != x.shape.type():
        raise ctx.error(
            f"zero point type {zero_point.shape.type()} differs from its input's {x.shape.type()}"
        )
    zp = _quant_param(
        ctx, ctx.convert(zero_point, "int32_type"), x.shape.lens(), per_row, "zero point"
    )
    return ctx.add(make_op("sub"), x32, zp)


def _quant_param(
    ctx: NodeContext, param: Instruction, lens: list[int], per_row: bool, what: str
) -> Instruction:
    """A zero point or scale broadcast to `lens`: a 1-D one of A's (`per_row`) along axis -2."""
    pl = param.shape.lens()
    if per_row and len(pl) == 1 and pl[0] != 1 and len(lens) >= 2:
        if pl[0] != lens[-2]:
            raise ctx.error(f"A's {what} has {pl[0]} values for {lens[-2]} rows")
        return ctx.add(Broadcast(axis=len(lens) - 2, out_lens=tuple(lens)), param)
    try:
        ok = broadcast_lens(pl, lens) == lens
    except ShapeError:
        ok = False
    if not ok:
        raise ctx.error(f"{what} of shape {pl} does not broadcast to {lens}")
    return ctx.broadcast_to(param, lens)


@onnx_op("MatMulInteger", since=10)
def parse_matmul_integer(ctx: NodeContext, args: Args) -> Instruction:
    a, b = args[0], args[1]
    a_zp = args[2] if len(args) > 2 else None
    b_zp = args[3] if len(args) > 3 else None
    for name, x in (("A", a), ("B", b)):
        if x.shape.type() not in ("int8_type", "uint8_type"):
            raise ctx.error(f"input {name} must be int8 or uint8, got {x.shape.type()}")
    if _is_zero(ctx, a_zp) and _is_zero(ctx, b_zp):
        return add_matmul(ctx, a, b, QuantDot())
    a = _subtract_zero_point(ctx, a, a_zp, per_row=True)
    b = _subtract_zero_point(ctx, b, b_zp, per_row=False)
    return add_matmul(ctx, a, b, Dot())


@onnx_op("QLinearMatMul", since=10)
def parse_qlinear_matmul(ctx: NodeContext, args: Args) -> Instruction:
    # the ONNX definition: saturate(rint((A - a_zp) @ (B - b_zp) * (a_s * b_s / y_s)) + y_zp),
    # the product accumulated exactly in int32
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale = args[:7]
    y_zp = args[7] if len(args) > 7 else None
    for name, x in (("a", a), ("b", b)):
        if x.shape.type() not in ("int8_type", "uint8_type"):
            raise ctx.error(f"input {name} must be int8 or uint8, got {x.shape.type()}")
    out_type = y_zp.shape.type() if y_zp is not None else a.shape.type()
    product = add_matmul(
        ctx,
        _subtract_zero_point(ctx, a, a_zp, per_row=True),
        _subtract_zero_point(ctx, b, b_zp, per_row=False),
        Dot(),
    )
    lens = product.shape.lens()
    scales = [ctx.convert(s, "float_type") for s in (a_scale, b_scale, y_scale)]
    scales[0] = _quant_param(ctx, scales[0], lens, a.shape.ndim() >= 2, "a_scale")
    scales[1] = _quant_param(ctx, scales[1], lens, False, "b_scale")
    scales[2] = _quant_param(ctx, scales[2], lens, False, "y_scale")
    multiplier = ctx.add(make_op("mul"), scales[0], scales[1])
    multiplier = ctx.add(make_op("div"), multiplier, scales[2])
    y = ctx.add(make_op("mul"), ctx.convert(product, "float_type"), multiplier)
    y = ctx.add(make_op("round"), y)
    if y_zp is not None:
        zp = ctx.convert(y_zp, "float_type")
        y = ctx.add(make_op("add"), y, _quant_param(ctx, zp, lens, False, "y_zero_point"))
    info = np.iinfo(to_dtype(out_type))
    y = ctx.add(Clip(), y, ctx.scalar(info.min, y), ctx.scalar(info.max, y))
    return ctx.convert(y, out_type)


@onnx_op("Gemm")
def parse_gemm(ctx: NodeContext, args: Args) -> Instruction:
    a, b = args[0], args[1]
    c = args[2] if len(args) > 2 else None
    if a.shape.ndim() != 2 or b.shape.ndim() != 2:
        raise ctx.error(f"A and B must be 2-D, got {a.shape.lens()} and {b.shape.lens()}")
    if a.shape.type() != b.shape.type():
        raise ctx.error(f"A and B have different types {a.shape.type()} and {b.shape.type()}")
    alpha = ctx.attr("alpha", 1.0)
    beta = ctx.attr("beta", 1.0)
    if alpha != 1.0:
        a = ctx.add(make_op("mul"), a, ctx.scalar(alpha, a))
    if ctx.attr("transA", 0):
        a = ctx.add(make_op("transpose", permutation=(1, 0)), a)
    if ctx.attr("transB", 0):
        b = ctx.add(make_op("transpose", permutation=(1, 0)), b)
    if a.shape.lens()[1] != b.shape.lens()[0]:
        raise ctx.error(
            f"inner dimensions differ: op(A) is {a.shape.lens()}, op(B) is {b.shape.lens()}"
        )
    out = ctx.add(Dot(), a, b)
    if c is None or beta == 0.0 or c.shape.elements() == 0:
        return out
    if c.shape.type() != out.shape.type():
        raise ctx.error(f"C has type {c.shape.type()}, A and B have {out.shape.type()}")
    lens = out.shape.lens()
    try:
        if broadcast_lens(c.shape.lens(), lens) != lens:
            raise ShapeError("")
    except ShapeError:
        raise ctx.error(f"C of shape {c.shape.lens()} does not broadcast to {lens}") from None
    c = ctx.broadcast_to(c, lens)
    if beta != 1.0:
        c = ctx.add(make_op("mul"), c, ctx.scalar(beta, c))
    return ctx.add(make_op("add"), out, c)
