"""Ops handlers: the primitive math that pointwise operators are written in.

A pointwise operator describes its math once, as `apply(o, *xs)` over a handler `o`
(`o.add(x, y)`, `o.exp(x)`, `o.where(c, a, b)`, ...). `NUMPY` runs that description on numpy
arrays (the reference semantics); the torch lowering and the Triton code generator provide
handlers with the same method names, so a fused group of pointwise operators is one description
that every target can run or compile.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.special
from numpy.typing import DTypeLike


class NumpyOps:
    """The numpy ops handler (errors on invalid values are silenced, as in C++)."""

    # arithmetic
    add = staticmethod(np.add)
    sub = staticmethod(np.subtract)
    mul = staticmethod(np.multiply)
    neg = staticmethod(np.negative)
    abs = staticmethod(np.abs)
    sign = staticmethod(np.sign)
    maximum = staticmethod(np.maximum)
    minimum = staticmethod(np.minimum)
    fmax = staticmethod(np.fmax)
    fmin = staticmethod(np.fmin)
    floor = staticmethod(np.floor)
    ceil = staticmethod(np.ceil)
    # transcendental
    exp = staticmethod(np.exp)
    log = staticmethod(np.log)
    sqrt = staticmethod(np.sqrt)
    sin = staticmethod(np.sin)
    cos = staticmethod(np.cos)
    tan = staticmethod(np.tan)
    asin = staticmethod(np.arcsin)
    acos = staticmethod(np.arccos)
    atan = staticmethod(np.arctan)
    sinh = staticmethod(np.sinh)
    cosh = staticmethod(np.cosh)
    tanh = staticmethod(np.tanh)
    asinh = staticmethod(np.arcsinh)
    acosh = staticmethod(np.arccosh)
    atanh = staticmethod(np.arctanh)
    isnan = staticmethod(np.isnan)
    isinf = staticmethod(np.isinf)
    # comparison and logic
    equal = staticmethod(np.equal)
    less = staticmethod(np.less)
    greater = staticmethod(np.greater)
    less_equal = staticmethod(np.less_equal)
    greater_equal = staticmethod(np.greater_equal)
    logical_and = staticmethod(np.logical_and)
    logical_or = staticmethod(np.logical_or)
    logical_xor = staticmethod(np.logical_xor)
    logical_not = staticmethod(np.logical_not)
    bitwise_and = staticmethod(np.bitwise_and)
    bitwise_or = staticmethod(np.bitwise_or)
    bitwise_xor = staticmethod(np.bitwise_xor)
    bitwise_not = staticmethod(np.invert)
    where = staticmethod(np.where)

    @staticmethod
    def div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Division; integers truncate toward zero (C semantics, as ONNX specifies)."""
        if np.issubdtype(x.dtype, np.integer):
            q = np.trunc(np.true_divide(x, y))
            return q.astype(x.dtype)
        return np.true_divide(x, y)

    @staticmethod
    def fmod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.fmod(x, y)

    @staticmethod
    def mod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.mod(x, y)

    @staticmethod
    def pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.power(x, y)

    @staticmethod
    def erf(x: np.ndarray) -> np.ndarray:
        return _erf(x)

    @staticmethod
    def round(x: np.ndarray) -> np.ndarray:
        return np.round(x)  # half to even, as ONNX Round

    @staticmethod
    def recip(x: np.ndarray) -> np.ndarray:
        return np.reciprocal(x)

    @staticmethod
    def rsqrt(x: np.ndarray) -> np.ndarray:
        return np.reciprocal(np.sqrt(x))

    @staticmethod
    def sigmoid(x: np.ndarray) -> np.ndarray:
        return _sigmoid(x)

    @staticmethod
    def constant(value: Any, like: np.ndarray) -> np.ndarray:
        """A scalar of `like`'s dtype (broadcasts against it)."""
        return np.asarray(value, dtype=np.asarray(like).dtype)

    @staticmethod
    def cast(x: np.ndarray, dtype: DTypeLike) -> np.ndarray:
        return np.asarray(x).astype(dtype)


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


NUMPY = NumpyOps()
