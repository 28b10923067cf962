"""Ops handlers: the primitive math that pointwise and reduce steps are written in.

A pointwise operator describes its math once, as `apply(o, *xs)` over a handler `o`
(`o.add(x, y)`, `o.exp(x)`, `o.where(c, a, b)`, ...). `OpsHandler` is the explicit list of those
primitives, reductions over axes included; `NUMPY` runs them on numpy arrays (the reference
semantics), the torch handler (`targets/torch_lowering/handler.py`) on torch tensors and the
Triton emitter (`codegen/triton/emitter.py`) writes them as `tl.` source, so a fused group is one
description that every backend runs or compiles. `missing_primitives(handler)` names what a
handler lacks (a test checks all three).

Two dtype rules live here and nowhere else:

* `compute_dtype(dtype)`: half, bf16 and fp8 values are computed in float32 and rounded once at
  the end of a step (as the ONNX reference does), every other type in itself;
* `accumulation_dtype(dtype)`: what a sum or product accumulates in (float32 for the narrow
  floats, the type itself otherwise: integer sums wrap).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar, runtime_checkable

import ml_dtypes
import numpy as np
import scipy.special
from numpy.typing import DTypeLike

Axes = Sequence[int]
_H = TypeVar("_H")

#: the floating types narrower than float32 (computed in float32)
_NARROW_FLOATS = frozenset(
    np.dtype(t)
    for t in (
        np.float16,
        ml_dtypes.bfloat16,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)


def compute_dtype(dtype: DTypeLike) -> np.dtype:
    """The type a value of `dtype` is computed in: float32 for fp16/bf16/fp8, else `dtype`."""
    dt = np.dtype(dtype)
    return np.dtype(np.float32) if dt in _NARROW_FLOATS else dt


def accumulation_dtype(dtype: DTypeLike) -> np.dtype:
    """The type a reduction of `dtype` accumulates in (narrow floats in float32; integer and
    bool sums in their own type, so they wrap as ONNX Runtime's do)."""
    return compute_dtype(dtype)


@runtime_checkable
class OpsHandler(Protocol):
    """Every primitive a pointwise or reduce step is written in.

    Values are whatever the handler works on (numpy arrays, torch tensors, Triton source
    expressions); each has a `.dtype`. Binary primitives take operands of one type (the
    frontend converts first) except `where`'s condition and `cast`'s target. Reductions keep
    the reduced axes as length 1 (as the IR does) and accumulate in `accumulation_dtype`.
    """

    # arithmetic
    def add(self, x: Any, y: Any) -> Any: ...
    def sub(self, x: Any, y: Any) -> Any: ...
    def mul(self, x: Any, y: Any) -> Any: ...
    def div(self, x: Any, y: Any) -> Any: ...  # integers truncate toward zero
    def fmod(self, x: Any, y: Any) -> Any: ...  # sign of the dividend
    def mod(self, x: Any, y: Any) -> Any: ...  # sign of the divisor
    def pow(self, x: Any, y: Any) -> Any: ...
    def neg(self, x: Any) -> Any: ...
    def abs(self, x: Any) -> Any: ...
    def sign(self, x: Any) -> Any: ...  # sign(nan) is nan
    def maximum(self, x: Any, y: Any) -> Any: ...  # nan propagates
    def minimum(self, x: Any, y: Any) -> Any: ...
    def fmax(self, x: Any, y: Any) -> Any: ...  # nan ignored
    def fmin(self, x: Any, y: Any) -> Any: ...
    def floor(self, x: Any) -> Any: ...
    def ceil(self, x: Any) -> Any: ...
    def round(self, x: Any) -> Any: ...  # half to even
    def recip(self, x: Any) -> Any: ...
    # transcendental
    def exp(self, x: Any) -> Any: ...
    def log(self, x: Any) -> Any: ...
    def sqrt(self, x: Any) -> Any: ...
    def rsqrt(self, x: Any) -> Any: ...
    def erf(self, x: Any) -> Any: ...
    def sigmoid(self, x: Any) -> Any: ...
    def sin(self, x: Any) -> Any: ...
    def cos(self, x: Any) -> Any: ...
    def tan(self, x: Any) -> Any: ...
    def asin(self, x: Any) -> Any: ...
    def acos(self, x: Any) -> Any: ...
    def atan(self, x: Any) -> Any: ...
    def sinh(self, x: Any) -> Any: ...
    def cosh(self, x: Any) -> Any: ...
    def tanh(self, x: Any) -> Any: ...
    def asinh(self, x: Any) -> Any: ...
    def acosh(self, x: Any) -> Any: ...
    def atanh(self, x: Any) -> Any: ...
    # classification, comparison and logic (results are bool)
    def isnan(self, x: Any) -> Any: ...
    def isinf(self, x: Any) -> Any: ...
    def equal(self, x: Any, y: Any) -> Any: ...
    def less(self, x: Any, y: Any) -> Any: ...
    def greater(self, x: Any, y: Any) -> Any: ...
    def less_equal(self, x: Any, y: Any) -> Any: ...
    def greater_equal(self, x: Any, y: Any) -> Any: ...
    def logical_and(self, x: Any, y: Any) -> Any: ...
    def logical_or(self, x: Any, y: Any) -> Any: ...
    def logical_xor(self, x: Any, y: Any) -> Any: ...
    def logical_not(self, x: Any) -> Any: ...
    def bitwise_and(self, x: Any, y: Any) -> Any: ...
    def bitwise_or(self, x: Any, y: Any) -> Any: ...
    def bitwise_xor(self, x: Any, y: Any) -> Any: ...
    def bitwise_not(self, x: Any) -> Any: ...
    def where(self, c: Any, x: Any, y: Any) -> Any: ...
    # values and types
    def constant(self, value: Any, like: Any) -> Any: ...  # a scalar of `like`'s dtype
    def cast(self, x: Any, dtype: DTypeLike) -> Any: ...
    # a float cast whose finite values beyond `dtype`'s range become its largest finite value
    # (with their sign) instead of an infinity; infinities and NaN pass (`convert`)
    def cast_finite(self, x: Any, dtype: DTypeLike) -> Any: ...
    def compute_dtype(self, dtype: DTypeLike) -> np.dtype: ...
    # reductions over `axes` (kept as length 1), in `accumulation_dtype`
    def reduce_sum(self, x: Any, axes: Axes) -> Any: ...
    def reduce_prod(self, x: Any, axes: Axes) -> Any: ...
    def reduce_max(self, x: Any, axes: Axes) -> Any: ...  # empty: the type's lowest
    def reduce_min(self, x: Any, axes: Axes) -> Any: ...  # empty: the type's highest
    def reduce_mean(self, x: Any, axes: Axes) -> Any: ...  # floats; empty gives 0


#: the primitive names, in `OpsHandler`'s order
PRIMITIVES: tuple[str, ...] = tuple(
    name for name in OpsHandler.__dict__ if not name.startswith("_") and name != "compute_dtype"
) + ("compute_dtype",)


def missing_primitives(handler: Any) -> list[str]:
    """The `OpsHandler` primitives that `handler` (an instance or class) does not provide."""
    return [name for name in PRIMITIVES if not callable(getattr(handler, name, None))]


def finite_max(dtype: DTypeLike) -> float:
    """The largest finite value of the float type `dtype` (bfloat16 and fp8 included)."""
    return float(ml_dtypes.finfo(np.dtype(dtype)).max)


def lowest(dtype: np.dtype) -> Any:
    """The identity of max over `dtype`: its lowest value (-inf for floats)."""
    if dtype == np.bool_:
        return False
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).min
    return -np.inf


def highest(dtype: np.dtype) -> Any:
    """The identity of min over `dtype`: its highest value (+inf for floats)."""
    if dtype == np.bool_:
        return True
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).max
    return np.inf


def library_primitives(
    library: Any, table: str, **functions: Callable[..., Any]
) -> Callable[[type[_H]], type[_H]]:
    """A class decorator that fills a handler from a table: each entry of `table` (separated
    by white space) is a primitive `name`, or `name=function`, that becomes a static method
    calling `library`'s function of that name; each keyword a static method calling the
    function it names. A function the library lacks fails at import time."""

    def fill(cls: type[_H]) -> type[_H]:
        for entry in table.split():
            name, _, function = entry.partition("=")
            setattr(cls, name, staticmethod(getattr(library, function or name)))
        for name, fn in functions.items():
            setattr(cls, name, staticmethod(fn))
        return cls

    return fill


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # numerically stable in both tails
    x = np.asarray(x)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1 / (1 + np.exp(-x[pos]))
    e = np.exp(x[~pos])
    out[~pos] = e / (1 + e)
    return out


def _erf(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return scipy.special.erf(x).astype(x.dtype, copy=False)


def _accumulated(reduce: Callable[..., np.ndarray], x: np.ndarray, axes: Axes) -> np.ndarray:
    """`reduce` (np.sum, np.prod) over `axes`, kept, in `accumulation_dtype`."""
    x = np.asarray(x)
    return reduce(x, axis=tuple(axes), keepdims=True, dtype=accumulation_dtype(x.dtype))


def _extreme(
    reduce: Callable[..., np.ndarray], empty: Callable[[np.dtype], Any], x: np.ndarray, axes: Axes
) -> np.ndarray:
    """`reduce` (np.max, np.min) over `axes`, kept; an empty reduction gives `empty(dtype)`."""
    x = np.asarray(x)
    return reduce(x, axis=tuple(axes), keepdims=True, initial=empty(x.dtype))


@library_primitives(
    np,
    """add sub=subtract mul=multiply neg=negative pow=power recip=reciprocal fmod mod round
    maximum minimum fmax fmin floor ceil abs sign exp log sqrt sin cos tan sinh cosh tanh
    asin=arcsin acos=arccos atan=arctan asinh=arcsinh acosh=arccosh atanh=arctanh
    isnan isinf equal less greater less_equal greater_equal logical_and logical_or logical_xor
    logical_not bitwise_and bitwise_or bitwise_xor bitwise_not=invert where""",
    erf=_erf,
    sigmoid=_sigmoid,
    compute_dtype=compute_dtype,
    reduce_sum=partial(_accumulated, np.sum),
    reduce_prod=partial(_accumulated, np.prod),
    reduce_max=partial(_extreme, np.max, lowest),
    reduce_min=partial(_extreme, np.min, highest),
)
class NumpyOps:
    """The numpy ops handler (errors on invalid values are silenced, as in C++): numpy's
    functions from the table above (`round` is half to even, as ONNX Round), and the
    primitives numpy has no one function for."""

    @staticmethod
    def div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Division; integers truncate toward zero (C semantics, as ONNX specifies)."""
        if np.issubdtype(x.dtype, np.integer):
            q = np.trunc(np.true_divide(x, y))
            return q.astype(x.dtype)
        return np.true_divide(x, y)

    @staticmethod
    def rsqrt(x: np.ndarray) -> np.ndarray:
        return np.reciprocal(np.sqrt(x))

    @staticmethod
    def constant(value: Any, like: np.ndarray) -> np.ndarray:
        """A scalar of `like`'s dtype (broadcasts against it)."""
        dtype = like.dtype if hasattr(like, "dtype") else np.asarray(like).dtype
        return np.asarray(value, dtype=dtype)

    @staticmethod
    def cast(x: np.ndarray, dtype: DTypeLike) -> np.ndarray:
        return np.asarray(x).astype(dtype)

    @staticmethod
    def cast_finite(x: np.ndarray, dtype: DTypeLike) -> np.ndarray:
        x = np.asarray(x)
        top = np.asarray(finite_max(dtype), dtype=x.dtype)
        return np.where(np.isinf(x), x, np.clip(x, -top, top)).astype(dtype)

    @staticmethod
    def reduce_mean(x: np.ndarray, axes: Axes) -> np.ndarray:
        x = np.asarray(x)
        total = _accumulated(np.sum, x, axes)
        count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        if count == 0:
            return total
        return total / np.asarray(count, dtype=total.dtype)


NUMPY = NumpyOps()
