"""Handlers of ONNX Softmax, LogSoftmax and Hardmax.

From opset 13 these act along one `axis` (default -1). Before opset 13 they coerce the input to
2-D at `axis` (default 1): the result is computed over all dimensions from `axis` on, which the
handler writes as reshape -> single-axis op -> reshape (left out when the trailing dimensions are
already one axis). Hardmax is `argmax` compared with the axis' index sequence, as a one-hot of
the first maximum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.shape import FLOAT_TYPES
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.broadcast import Broadcast
from pygraphx.ops.pointwise import Contiguous
from pygraphx.ops.softmax import Logsoftmax, Softmax

Args = list[Instruction | None]
AxisFn = Callable[[NodeContext, Instruction, int], Instruction]


def normalized_axis(ctx: NodeContext, axis: int, rank: int) -> int:
    """`axis` in [0, rank), or a node error naming the range."""
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for an input of rank {rank}")
    return axis + rank if axis < 0 else axis


def reshape(ctx: NodeContext, ins: Instruction, dims: Sequence[int]) -> Instruction:
    """`reshape` to `dims`, made contiguous first when `ins` is not standard-strided."""
    if ins.shape.lens() == list(dims):
        return ins
    if not ins.shape.standard():
        ins = ctx.add(Contiguous(), ins)
    return ctx.add(make_op("reshape", dims=tuple(int(d) for d in dims)), ins)


def _float_input(ctx: NodeContext, x: Instruction) -> None:
    if x.shape.type() not in FLOAT_TYPES:
        raise ctx.error(f"input must be a floating-point tensor, got {x.shape.type()}")
    if x.shape.ndim() == 0:
        raise ctx.error("input must have rank 1 or more, got a scalar")


def _coerced_2d(ctx: NodeContext, x: Instruction, axis: int, fn: AxisFn) -> Instruction:
    """Opset < 13: `fn` over the flattened dimensions `axis..rank-1`."""
    lens = x.shape.lens()
    axis = normalized_axis(ctx, axis, len(lens))
    if prod(lens[axis + 1 :]) == 1:
        return fn(ctx, x, axis)  # one axis already (trailing dimensions of length 1)
    flat = reshape(ctx, x, [prod(lens[:axis]), prod(lens[axis:])])
    return reshape(ctx, fn(ctx, flat, 1), lens)


def _softmax(ctx: NodeContext, x: Instruction, axis: int) -> Instruction:
    return ctx.add(Softmax(axis=axis), x)


def _logsoftmax(ctx: NodeContext, x: Instruction, axis: int) -> Instruction:
    return ctx.add(Logsoftmax(axis=axis), x)


def _hardmax(ctx: NodeContext, x: Instruction, axis: int) -> Instruction:
    """One-hot of the first maximum along `axis`: equal(argmax, iota), in x's type."""
    lens = x.shape.lens()
    index = ctx.convert(ctx.add(make_op("argmax", axis=axis), x), "int64_type")
    iota = ctx.literal(np.arange(lens[axis], dtype=np.int64))
    iota = ctx.add(Broadcast(axis=axis, out_lens=tuple(lens)), iota)
    hot = ctx.add(make_op("equal"), ctx.broadcast_to(index, lens), iota)
    return ctx.convert(hot, x.shape.type())


def _register(op_type: str, fn: AxisFn) -> None:
    def before_13(ctx: NodeContext, args: Args) -> Instruction:
        _float_input(ctx, args[0])
        return _coerced_2d(ctx, args[0], ctx.attr("axis", 1), fn)

    def since_13(ctx: NodeContext, args: Args) -> Instruction:
        x = args[0]
        _float_input(ctx, x)
        return fn(ctx, x, normalized_axis(ctx, ctx.attr("axis", -1), x.shape.ndim()))

    before_13.__name__ = f"parse_{op_type.lower()}_v1"
    since_13.__name__ = f"parse_{op_type.lower()}"
    onnx_op(op_type)(before_13)
    onnx_op(op_type, since=13)(since_13)


_register("Softmax", _softmax)
_register("LogSoftmax", _logsoftmax)
_register("Hardmax", _hardmax)
