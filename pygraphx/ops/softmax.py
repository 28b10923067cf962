"""Softmax family: `softmax` and `logsoftmax` along one `axis`, as MIGraphX defines them.

Both are numerically stable: the maximum along the axis is subtracted before exponentiating, so
large finite inputs neither overflow nor produce NaN. IEEE special values follow ONNX Runtime
(and torch): a slice holding NaN or +Inf, or only -Inf, is all NaN (`inf - inf` is NaN).
Half, bf16 and fp8 inputs are computed in float32 and rounded once. ONNX's pre-opset-13
"coerce to 2-D" semantics are the frontend's business (it reshapes around a single-axis softmax).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from pygraphx.ir.shape import FLOAT_TYPES, Shape
from pygraphx.ops.base import Op, ShapeError, check_arity, normalize_axis, register_op


def _check(op: Op, inputs: Sequence[Shape], axis: int) -> Shape:
    check_arity(op, inputs, 1)
    s = inputs[0]
    if s.type() not in FLOAT_TYPES:
        raise ShapeError(f"{op.name}: input must be a floating-point type, got {s.type()}")
    if s.ndim() == 0:
        raise ShapeError(f"{op.name}: input must have rank 1 or more, got a scalar")
    normalize_axis(op, axis, s.ndim())
    return Shape(s.type(), s.lens())


def _shifted(x: np.ndarray, axis: int) -> np.ndarray:
    """`x - max(x, axis)` in float32 (or float64 for double inputs)."""
    work = np.float64 if x.dtype == np.float64 else np.float32
    x = np.asarray(x, dtype=work)
    if x.size == 0:
        return x.copy()
    # no special case for an infinite maximum: like ONNX Runtime, such a slice becomes NaN
    return x - np.max(x, axis=axis, keepdims=True)


def _softmax(d: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(d)
    return e / np.sum(e, axis=axis, keepdims=True)


def _logsoftmax(d: np.ndarray, axis: int) -> np.ndarray:
    return d - np.log(np.sum(np.exp(d), axis=axis, keepdims=True))


def _along_axis(
    op: Op, output_shape: Shape, x: np.ndarray, f: Callable[[np.ndarray, int], np.ndarray]
) -> np.ndarray:
    """`f(x - max(x), axis)` along the op's axis, in the output's type."""
    axis = normalize_axis(op, op.axis, x.ndim)  # type: ignore[attr-defined]
    with np.errstate(all="ignore"):
        out = f(_shifted(x, axis), axis)
    return out.astype(output_shape.dtype())


@dataclasses.dataclass(frozen=True)
class _AlongAxis(Op):
    """An op computing `along(x - max(x), axis)` over one axis (`along` is a class attribute)."""

    axis: int = 1
    along: ClassVar[Callable[[np.ndarray, int], np.ndarray]]

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        return _check(self, inputs, self.axis)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        return _along_axis(self, output_shape, args[0], type(self).along)


@register_op
class Softmax(_AlongAxis):
    """exp(x) / sum(exp(x)) along `axis`."""

    name = "softmax"
    along = staticmethod(_softmax)


@register_op
class Logsoftmax(_AlongAxis):
    """x - log(sum(exp(x))) along `axis`."""

    name = "logsoftmax"
    along = staticmethod(_logsoftmax)
