"""Handlers of miscellaneous ONNX ops: Shrink, Det, Einsum, IsInf and BitShift.

Shrink is written with pointwise IR ops (`where` over two comparisons, in double for integers);
Det, Einsum and BitShift map to IR ops of their own (`det`, `einsum[equation]`,
`bitshift[direction]`); IsInf is the `isinf` pointwise op, and-ed with a sign test when only one
infinity is to be detected.
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.shape import FLOAT_TYPES
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.base import ShapeError
from pygraphx.ops.misc import Bitshift, Det, Einsum, einsum_lens
from pygraphx.ops.pointwise import Isinf, Where

Args = list[Instruction | None]


@onnx_op("Shrink", since=9)
def parse_shrink(ctx: NodeContext, args: Args) -> Instruction:
    # y = x + bias where x < -lambd, x - bias where x > lambd, else 0; integers are compared and
    # shifted as doubles and the result converted back (as ONNX Runtime computes in float)
    x = args[0]
    lambd = ctx.attr("lambd", 0.5)
    bias = ctx.attr("bias", 0.0)
    type_name = x.shape.type()
    if type_name not in FLOAT_TYPES:
        x = ctx.convert(x, "double_type")
    below = ctx.add(make_op("less"), x, ctx.scalar(-lambd, x))
    above = ctx.add(make_op("greater"), x, ctx.scalar(lambd, x))
    y = ctx.add(Where(), above, ctx.add(make_op("sub"), x, ctx.scalar(bias, x)), ctx.scalar(0, x))
    y = ctx.add(Where(), below, ctx.add(make_op("add"), x, ctx.scalar(bias, x)), y)
    return ctx.convert(y, type_name)


@onnx_op("Det", since=11)
def parse_det(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    lens = x.shape.lens()
    if len(lens) < 2 or lens[-1] != lens[-2]:
        raise ctx.error(f"input {lens} is not a (batch of) square matrices [..., M, M]")
    return ctx.add(Det(), x)


@onnx_op("Einsum", since=12)
def parse_einsum(ctx: NodeContext, args: Args) -> Instruction:
    equation = ctx.attr("equation")
    xs = [a for a in args if a is not None]
    try:
        einsum_lens(equation, [x.shape.lens() for x in xs])
    except ShapeError as exc:
        raise ctx.error(str(exc)) from None
    return ctx.add(Einsum(equation=equation), *xs)


@onnx_op("IsInf", since=10)
def parse_isinf(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    positive = bool(ctx.attr("detect_positive", 1))
    negative = bool(ctx.attr("detect_negative", 1))
    if x.shape.type() not in FLOAT_TYPES or not (positive or negative):
        false = ctx.literal(np.zeros((), np.bool_))
        return ctx.broadcast_to(false, x.shape.lens())
    inf = ctx.add(Isinf(), x)
    if positive and negative:
        return inf
    sign = ctx.add(make_op("greater" if positive else "less"), x, ctx.scalar(0, x))
    return ctx.add(make_op("logical_and"), inf, sign)


@onnx_op("BitShift", since=11)
def parse_bitshift(ctx: NodeContext, args: Args) -> Instruction:
    direction = ctx.attr("direction").lower()
    if direction not in ("left", "right"):
        raise ctx.error(f"direction must be 'LEFT' or 'RIGHT', got {direction.upper()!r}")
    x, y = ctx.broadcast(args[0], args[1])
    if x.shape.type() != y.shape.type():
        raise ctx.error(f"inputs have different types {x.shape.type()} and {y.shape.type()}")
    if x.shape.dtype().kind != "u" and x.shape.dtype().kind != "i":
        raise ctx.error(f"type {x.shape.type()} is not an integer type")
    return ctx.add(Bitshift(direction=direction), x, y)
