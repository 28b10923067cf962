"""Activation functions as IR operators: gelu (erf and tanh forms), silu, hardswish,
hardsigmoid, mish, softplus.

Each operator's maths is written once, in `decompose(o, x)`, over the ops-handler primitives
(`handler.py`), so the numpy reference, the torch lowering and a code generator all run the same
description. A handler may instead provide a method of the operator's name (the torch handler's
`gelu` calls torch's fused kernel); `apply` then uses it. The ONNX frontend emits these operators
for Gelu, HardSwish, HardSigmoid, Mish, Softplus and the com.microsoft GELU family, and the
`recognize_activations` pass finds their decomposed forms in any model.

A primitive missing from the handler, written from existing ones: `log1p` (for softplus and
mish), as `log(w) * u / (w - 1)` with `w = 1 + u` (exact to a few ulps; `u` where `w == 1`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pygraphx.ir.shape import Shape
from pygraphx.ops.base import ShapeError, register_op
from pygraphx.ops.pointwise import Pointwise

SQRT_HALF = 0.7071067811865476  # 1 / sqrt(2)
SQRT_2_OVER_PI = 0.7978845608028654  # sqrt(2 / pi)
GELU_TANH_CUBIC = 0.044715


def native(o: Any, name: str) -> Callable[..., Any] | None:
    """The handler's own method `name` (looked up on its class), or None."""
    return getattr(o, name) if hasattr(type(o), name) else None


class Activation(Pointwise):
    """Base of activations: a float-only unary op computed by `decompose` unless the handler
    has a native method of the op's name (and the op has no attributes it would ignore)."""

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        out = super().compute_shape(inputs)
        t = inputs[0].type()
        if not (np.issubdtype(inputs[0].dtype(), np.floating) or t == "bf16_type"):
            raise ShapeError(f"{self.name}: input must be a float type, got {t}")
        return out

    def apply(self, o: Any, x: Any) -> Any:
        fast = native(o, self.name) if self.uses_native() else None
        return fast(x) if fast is not None else self.decompose(o, x)

    def uses_native(self) -> bool:
        return True

    def decompose(self, o: Any, x: Any) -> Any:
        raise NotImplementedError


def _c(o: Any, value: float, x: Any) -> Any:
    return o.constant(value, x)


def log1p(o: Any, u: Any) -> Any:
    """log(1 + u), accurate for small u (the rounding error of 1 + u is divided back out)."""
    w = o.add(u, _c(o, 1, u))
    wm1 = o.sub(w, _c(o, 1, u))
    exact = o.equal(wm1, _c(o, 0, u))
    safe = o.where(exact, _c(o, 1, u), wm1)  # no 0/0 where the branch is not taken
    return o.where(exact, u, o.div(o.mul(o.log(w), u), safe))


def _half_x_one_plus(o: Any, x: Any, t: Any) -> Any:
    """x * 0.5 * (1 + t): the common outer form of both GELUs (t = erf(...) or tanh(...))."""
    return o.mul(o.mul(x, _c(o, 0.5, x)), o.add(t, _c(o, 1, x)))


@register_op
class Gelu(Activation):
    """x * 0.5 * (1 + erf(x / sqrt(2)))."""

    name = "gelu"

    def decompose(self, o: Any, x: Any) -> Any:
        return _half_x_one_plus(o, x, o.erf(o.mul(x, _c(o, SQRT_HALF, x))))


@register_op
class GeluTanh(Activation):
    """x * 0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))."""

    name = "gelu_tanh"

    def decompose(self, o: Any, x: Any) -> Any:
        x3 = o.mul(o.mul(x, x), x)
        inner = o.add(x, o.mul(x3, _c(o, GELU_TANH_CUBIC, x)))
        return _half_x_one_plus(o, x, o.tanh(o.mul(inner, _c(o, SQRT_2_OVER_PI, x))))


@register_op
class Silu(Activation):
    """x * sigmoid(x) (ONNX Swish with alpha 1)."""

    name = "silu"

    def decompose(self, o: Any, x: Any) -> Any:
        return o.mul(x, o.sigmoid(x))


@register_op
class Hardsigmoid(Activation):
    """max(0, min(1, alpha * x + beta)) (ONNX's defaults: alpha 0.2, beta 0.5)."""

    name = "hardsigmoid"
    alpha: float = 0.2
    beta: float = 0.5

    def uses_native(self) -> bool:
        return False  # native hardsigmoids (torch's) fix alpha = 1/6

    def decompose(self, o: Any, x: Any) -> Any:
        y = o.add(o.mul(x, _c(o, self.alpha, x)), _c(o, self.beta, x))
        return o.minimum(o.maximum(y, _c(o, 0, x)), _c(o, 1, x))


@register_op
class Hardswish(Activation):
    """x * hardsigmoid(x) with alpha 1/6, beta 0.5."""

    name = "hardswish"

    def decompose(self, o: Any, x: Any) -> Any:
        return o.mul(x, Hardsigmoid(alpha=1 / 6, beta=0.5).decompose(o, x))


@register_op
class Softplus(Activation):
    """log(1 + exp(x)), computed without overflow as max(x, 0) + log1p(exp(-|x|))."""

    name = "softplus"

    def decompose(self, o: Any, x: Any) -> Any:
        tail = log1p(o, o.exp(o.neg(o.abs(x))))
        return o.add(o.maximum(x, _c(o, 0, x)), tail)


@register_op
class Mish(Activation):
    """x * tanh(softplus(x))."""

    name = "mish"

    def decompose(self, o: Any, x: Any) -> Any:
        return o.mul(x, o.tanh(Softplus().decompose(o, x)))


#: activations whose handler-native method takes `x` alone (what a handler may provide)
NATIVE_ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "hardswish", "mish", "softplus")
