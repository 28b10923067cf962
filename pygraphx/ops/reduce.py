"""Reductions and scans: `reduce_*`, `argmax`/`argmin`, `topk`, `prefix_scan_sum`.

As in MIGraphX the reductions keep every reduced dimension as length 1 (the ONNX frontend adds
`squeeze` for keepdims=0) and an empty `axes` reduces over all dimensions. The result type is the
input type; half-precision floats accumulate in float32, integer sums and products wrap in their
own type (the integer mean sums in 64 bits). An empty reduction gives the operation's identity: 0
for sum (and mean), 1 for prod, the lowest value of the type for max (-inf for floats, the
minimum for integers, false for bool) and the highest for min.

`argmax`/`argmin` also keep the reduced axis and give int64 indices (first occurrence, or the
last with `select_last_index`). MIGraphX's `topk` returns a tuple of (values, indices); our IR
has one value per instruction, so `topk[output=0]` gives the values and `topk[output=1]` the
int64 indices, and the frontend emits it twice. Ties go to the lower index, as ONNX specifies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from pygraphx.ir.shape import Shape
from pygraphx.ops.base import OneInputOp, Op, ShapeError, normalize_axis, register_op
from pygraphx.ops.handler import accumulation_dtype, highest, lowest


def normalize_axes(op: Op, axes: Sequence[int], rank: int) -> tuple[int, ...]:
    """`axes` made non-negative and checked (range, duplicates); empty means all axes."""
    if not axes:
        return tuple(range(rank))
    if rank == 0:
        raise ShapeError(f"{op.name}: axes {list(axes)} given for a scalar input (it has none)")
    out = tuple(normalize_axis(op, int(a), rank) for a in axes)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op.name}: axes {list(axes)} name a dimension twice")
    return out


def _accumulator(x: np.ndarray) -> np.dtype:
    """The dtype to accumulate `x` in (the rule is `ops.handler.accumulation_dtype`)."""
    return accumulation_dtype(x.dtype)


@dataclasses.dataclass(frozen=True)
class Reduce(OneInputOp):
    """Base of the `reduce_*` operators: `axes` (empty = all) kept as length-1 dimensions."""

    axes: tuple[int, ...] = ()

    def shape_for(self, s: Shape) -> Shape:
        lens = s.lens()
        for a in normalize_axes(self, self.axes, s.ndim()):
            lens[a] = 1
        return Shape(s.type(), lens)

    def reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = np.asarray(args[0])
        axes = normalize_axes(self, self.axes, x.ndim)
        with np.errstate(all="ignore"):
            out = self.reduce(x, axes)
        return np.asarray(out).astype(output_shape.dtype(), copy=False)


@register_op
class ReduceSum(Reduce):
    name = "reduce_sum"

    def reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return np.sum(x, axis=axes, keepdims=True, dtype=_accumulator(x))


@register_op
class ReduceMean(Reduce):
    """Mean; integer inputs divide their 64-bit sum by the count, truncating toward zero.

    The mean of an empty set is 0 (ONNX leaves it undefined; ONNX Runtime gives 0)."""

    name = "reduce_mean"

    def reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        if np.issubdtype(x.dtype, np.integer):
            # summed in 64 bits (as ONNX Runtime does), divided truncating toward zero
            wide = np.uint64 if x.dtype == np.uint64 else np.int64
            t = np.sum(x, axis=axes, keepdims=True, dtype=wide)
            if count == 0:
                return np.zeros_like(t)
            n = np.asarray(count, dtype=wide)
            return t // n + ((t % n != 0) & (t < 0)).astype(wide)
        total = np.sum(x, axis=axes, keepdims=True, dtype=_accumulator(x))
        if count == 0:
            return total  # zeros, as ONNX Runtime gives for an empty set (not 0/0)
        return total / np.asarray(count, dtype=total.dtype)


@register_op
class ReduceMax(Reduce):
    name = "reduce_max"

    def reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return np.max(x, axis=axes, keepdims=True, initial=lowest(x.dtype))


@register_op
class ReduceMin(Reduce):
    name = "reduce_min"

    def reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return np.min(x, axis=axes, keepdims=True, initial=highest(x.dtype))


@register_op
class ReduceProd(Reduce):
    name = "reduce_prod"

    def reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return np.prod(x, axis=axes, keepdims=True, dtype=_accumulator(x))


@dataclasses.dataclass(frozen=True)
class ArgReduce(OneInputOp):
    """Base of `argmax`/`argmin`: int64 index along `axis`, which is kept as length 1."""

    axis: int = 0
    select_last_index: bool = False
    pick: ClassVar = staticmethod(np.argmax)

    def shape_for(self, s: Shape) -> Shape:
        if s.ndim() == 0:
            raise ShapeError(f"{self.name}: the input is a scalar; it needs at least one axis")
        axis = normalize_axis(self, self.axis, s.ndim())
        lens = s.lens()
        if lens[axis] == 0:
            raise ShapeError(f"{self.name}: axis {self.axis} of input {lens} is empty")
        lens[axis] = 1
        return Shape("int64_type", lens)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = np.asarray(args[0])
        axis = normalize_axis(self, self.axis, x.ndim)
        if self.select_last_index:
            flipped = self.pick(np.flip(x, axis=axis), axis=axis, keepdims=True)
            idx = x.shape[axis] - 1 - flipped
        else:
            idx = self.pick(x, axis=axis, keepdims=True)
        return idx.astype(np.int64, copy=False)


@register_op
class Argmax(ArgReduce):
    name = "argmax"
    pick = staticmethod(np.argmax)


@register_op
class Argmin(ArgReduce):
    name = "argmin"
    pick = staticmethod(np.argmin)


def _stable_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """Indices sorting `x` along `axis` (descending if `largest`), ties by lower index first."""
    if not largest:
        return np.argsort(x, axis=axis, kind="stable")
    # ascending stable sort of the reversed axis, reversed again: descending, and among equal
    # values the lower original index comes first
    n = x.shape[axis]
    order = np.argsort(np.flip(x, axis=axis), axis=axis, kind="stable")
    return (n - 1 - np.flip(order, axis=axis)).astype(np.int64)


@register_op
class Topk(OneInputOp):
    """The `k` largest (or smallest) elements along `axis`, sorted, lower index first on ties.

    `output=0` gives the values (the input's type), `output=1` their int64 indices; MIGraphX
    returns both as a tuple instead.
    """

    name = "topk"
    k: int = 1
    axis: int = -1
    largest: bool = True
    output: int = 0

    def shape_for(self, s: Shape) -> Shape:
        if s.ndim() == 0:
            raise ShapeError("topk: the input is a scalar; it needs at least one axis")
        axis = normalize_axis(self, self.axis, s.ndim())
        lens = s.lens()
        if not 0 <= self.k <= lens[axis]:
            raise ShapeError(f"topk: k={self.k} is outside [0, {lens[axis]}] for axis {axis}")
        if self.output not in (0, 1):
            raise ShapeError(f"topk: output must be 0 (values) or 1 (indices), got {self.output}")
        lens[axis] = self.k
        return Shape(s.type() if self.output == 0 else "int64_type", lens)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = np.asarray(args[0])
        axis = normalize_axis(self, self.axis, x.ndim)
        order = _stable_order(x, axis, self.largest)
        idx = np.take(order, np.arange(self.k), axis=axis)
        if self.output == 1:
            return idx.astype(np.int64, copy=False)
        return np.take_along_axis(x, idx, axis=axis)


@register_op
class PrefixScanSum(OneInputOp):
    """Cumulative sum along `axis` (ONNX CumSum); `exclusive` leaves out the element itself,
    `reverse` sums from the end."""

    name = "prefix_scan_sum"
    axis: int = 0
    exclusive: bool = False
    reverse: bool = False

    def shape_for(self, s: Shape) -> Shape:
        if s.ndim() == 0:
            raise ShapeError("prefix_scan_sum: the input is a scalar; it needs at least one axis")
        normalize_axis(self, self.axis, s.ndim())
        return Shape(s.type(), s.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = np.asarray(args[0])
        axis = normalize_axis(self, self.axis, x.ndim)
        if self.reverse:
            x = np.flip(x, axis=axis)
        out = np.cumsum(x, axis=axis, dtype=_accumulator(x))
        if self.exclusive:
            shifted = np.zeros_like(out)
            head = [slice(None)] * x.ndim
            tail = [slice(None)] * x.ndim
            head[axis], tail[axis] = slice(1, None), slice(None, -1)
            shifted[tuple(head)] = out[tuple(tail)]
            out = shifted
        if self.reverse:
            out = np.flip(out, axis=axis)
        return np.asarray(out, order="C").astype(output_shape.dtype(), copy=False)
