"""Handlers of ONNX reductions (Reduce*), ArgMax/ArgMin, TopK and CumSum.

The IR reductions keep the reduced dimensions (as MIGraphX's do), so `keepdims=0` adds a
`squeeze` of the reduced axes. `axes` is an attribute up to opset 12 (ReduceSum) or 17 (the
others) and an optional constant input after, where `noop_with_empty_axes=1` with no axes makes
the reduction an identity (the element-wise parts of the composite reductions still apply, as
in ONNX's reference and ONNX Runtime). ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp and
ReduceSumSquare are written as pointwise + `reduce_sum`/`reduce_max` IR ops; ReduceLogSumExp
subtracts the (finite) maximum first so that it does not overflow.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.pointwise import Isinf, Where
from pygraphx.ops.reduce import (
    Argmax,
    Argmin,
    PrefixScanSum,
    ReduceMax,
    ReduceMean,
    ReduceMin,
    ReduceProd,
    ReduceSum,
    Topk,
)

Args = list[Instruction | None]
# builds the reduction of x over the (normalised, non-empty) axes, keeping them
Body = Callable[[NodeContext, Instruction, tuple[int, ...]], Instruction]
# the result when noop_with_empty_axes leaves no axes to reduce
Noop = Callable[[NodeContext, Instruction], Instruction]


# --- axes -------------------------------------------------------------------------------------
def _normalize(ctx: NodeContext, axes: tuple[int, ...], rank: int) -> tuple[int, ...]:
    out = []
    for a in axes:
        if not -rank <= a < max(rank, 1):
            raise ctx.error(f"axis {a} is out of range for an input of rank {rank}")
        out.append(a + rank if a < 0 else a)
    if len(set(out)) != len(out):
        raise ctx.error(f"axes {list(axes)} name a dimension twice")
    return tuple(out)


def _axes_from_attr(ctx: NodeContext, rank: int) -> tuple[int, ...]:
    """Reduced axes from the `axes` attribute (absent: all); never a no-op."""
    axes = ctx.attr("axes", None)
    if axes is None or len(axes) == 0:
        return tuple(range(rank))
    return _normalize(ctx, tuple(axes), rank)


def _axes_from_input(ctx: NodeContext, args: Args, rank: int) -> tuple[int, ...] | None:
    """Reduced axes from the optional `axes` input; None means a no-op (noop_with_empty_axes)."""
    axes_in = args[1] if len(args) > 1 else None
    axes: tuple[int, ...] = ()
    if axes_in is not None:
        value = ctx.require_const(axes_in, "axes")
        axes = tuple(int(a) for a in np.asarray(value).reshape(-1))
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return None
        return tuple(range(rank))
    return _normalize(ctx, axes, rank)


def _keep_or_squeeze(ctx: NodeContext, y: Instruction, axes: tuple[int, ...]) -> Instruction:
    if ctx.attr("keepdims", 1) or not axes:
        return y
    return ctx.add(make_op("squeeze", axes=tuple(sorted(axes))), y)


def _reduce_handler(body: Body, noop: Noop, axes_input: bool) -> Callable[..., Instruction]:
    def handler(ctx: NodeContext, args: Args) -> Instruction:
        x = args[0]
        rank = x.shape.ndim()
        axes = _axes_from_input(ctx, args, rank) if axes_input else _axes_from_attr(ctx, rank)
        if axes is None:
            return noop(ctx, x)
        if not axes:  # a scalar input: nothing to reduce, but the element-wise parts apply
            return noop(ctx, x)
        return _keep_or_squeeze(ctx, body(ctx, x, axes), axes)

    return handler


# --- reduction bodies -------------------------------------------------------------------------
def _plain(cls: type) -> Body:
    def body(ctx: NodeContext, x: Instruction, axes: tuple[int, ...]) -> Instruction:
        return ctx.add(cls(axes=axes), x)

    return body


def _identity(ctx: NodeContext, x: Instruction) -> Instruction:
    return x


def _square(ctx: NodeContext, x: Instruction) -> Instruction:
    return ctx.add(make_op("mul"), x, x)


def _abs(ctx: NodeContext, x: Instruction) -> Instruction:
    return ctx.add(make_op("abs"), x)


def _log(ctx: NodeContext, x: Instruction) -> Instruction:
    return ctx.add(make_op("log"), x)


def _sum_of(pre: Noop, post: Noop | None = None) -> tuple[Body, Noop]:
    """reduce_sum(pre(x)) then post(); and post(pre(x)) for the no-op case."""

    def body(ctx: NodeContext, x: Instruction, axes: tuple[int, ...]) -> Instruction:
        y = ctx.add(ReduceSum(axes=axes), pre(ctx, x))
        return post(ctx, y) if post else y

    def noop(ctx: NodeContext, x: Instruction) -> Instruction:
        y = pre(ctx, x)
        return post(ctx, y) if post else y

    return body, noop


def _log_sum_exp(ctx: NodeContext, x: Instruction, axes: tuple[int, ...]) -> Instruction:
    # m + log(sum(exp(x - m))) with m = max(x) replaced by 0 where it is infinite (all -inf
    # or an empty set: -inf results; a +inf element: +inf), so that x - m never gives nan
    m = ctx.add(ReduceMax(axes=axes), x)
    if x.shape.dtype().kind in "fV":
        finite = ctx.add(Isinf(), m)
        m = ctx.add(Where(), finite, ctx.scalar(0, m), m)
    shifted = ctx.add(make_op("sub"), x, ctx.broadcast_to(m, x.shape.lens()))
    total = ctx.add(ReduceSum(axes=axes), ctx.add(make_op("exp"), shifted))
    return ctx.add(make_op("add"), ctx.add(make_op("log"), total), m)


_L1 = _sum_of(_abs)
_L2 = _sum_of(_square, lambda ctx, y: ctx.add(make_op("sqrt"), y))
_LOG_SUM = _sum_of(_identity, _log)
_SUM_SQUARE = _sum_of(_square)

# ONNX op -> (body, no-op result, first opset with axes as an input)
REDUCTIONS: dict[str, tuple[Body, Noop, int]] = {
    "ReduceSum": (_plain(ReduceSum), _identity, 13),
    "ReduceMean": (_plain(ReduceMean), _identity, 18),
    "ReduceMax": (_plain(ReduceMax), _identity, 18),
    "ReduceMin": (_plain(ReduceMin), _identity, 18),
    "ReduceProd": (_plain(ReduceProd), _identity, 18),
    "ReduceL1": (*_L1, 18),
    "ReduceL2": (*_L2, 18),
    "ReduceLogSum": (*_LOG_SUM, 18),
    "ReduceLogSumExp": (_log_sum_exp, _identity, 18),
    "ReduceSumSquare": (*_SUM_SQUARE, 18),
}

for _op, (_body, _noop, _since) in REDUCTIONS.items():
    onnx_op(_op)(_reduce_handler(_body, _noop, axes_input=False))
    onnx_op(_op, since=_since)(_reduce_handler(_body, _noop, axes_input=True))


# --- ArgMax / ArgMin --------------------------------------------------------------------------
def _arg_handler(cls: type) -> Callable[..., Instruction]:
    def handler(ctx: NodeContext, args: Args) -> Instruction:
        x = args[0]
        rank = x.shape.ndim()
        (axis,) = _normalize(ctx, (ctx.attr("axis", 0),), rank)
        if x.shape.lens()[axis] == 0:
            raise ctx.error(f"axis {axis} of input {x.shape.lens()} is empty: nothing to pick")
        y = ctx.add(cls(axis=axis, select_last_index=bool(ctx.attr("select_last_index", 0))), x)
        return _keep_or_squeeze(ctx, y, (axis,))

    return handler


onnx_op("ArgMax")(_arg_handler(Argmax))
onnx_op("ArgMin")(_arg_handler(Argmin))


# --- TopK -------------------------------------------------------------------------------------
def _topk(ctx: NodeContext, x: Instruction, k: int) -> list[Instruction]:
    rank = x.shape.ndim()
    if rank == 0:
        raise ctx.error("input is a scalar; TopK needs at least one axis")
    (axis,) = _normalize(ctx, (ctx.attr("axis", -1),), rank)
    n = x.shape.lens()[axis]
    if not 0 <= k <= n:
        raise ctx.error(f"k={k} is outside [0, {n}] (the length of axis {axis})")
    largest = bool(ctx.attr("largest", 1))
    # sorted=0 lets the order be anything; a sorted result is one of them
    values = ctx.add(Topk(k=k, axis=axis, largest=largest, output=0), x)
    indices = ctx.add(Topk(k=k, axis=axis, largest=largest, output=1), x)
    return [values, indices]


@onnx_op("TopK")
def parse_topk_v1(ctx: NodeContext, args: Args) -> list[Instruction]:
    return _topk(ctx, args[0], int(ctx.attr("k")))


@onnx_op("TopK", since=10)
def parse_topk(ctx: NodeContext, args: Args) -> list[Instruction]:
    k = np.asarray(ctx.require_const(args[1] if len(args) > 1 else None, "K")).reshape(-1)
    if k.size != 1:
        raise ctx.error(f"input 'K' must hold one value, got {k.size}")
    return _topk(ctx, args[0], int(k[0]))


# --- CumSum -----------------------------------------------------------------------------------
@onnx_op("CumSum", since=11)
def parse_cumsum(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    axis_value = np.asarray(ctx.require_const(args[1], "axis")).reshape(-1)
    if axis_value.size != 1:
        raise ctx.error(f"input 'axis' must hold one value, got {axis_value.size}")
    rank = x.shape.ndim()
    if rank == 0:
        raise ctx.error("input is a scalar; CumSum needs at least one axis")
    (axis,) = _normalize(ctx, (int(axis_value[0]),), rank)
    op = PrefixScanSum(
        axis=axis,
        exclusive=bool(ctx.attr("exclusive", 0)),
        reverse=bool(ctx.attr("reverse", 0)),
    )
    return ctx.add(op, x)
