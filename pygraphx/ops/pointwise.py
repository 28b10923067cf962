"""Pointwise (element-wise) operators: unary math, binary arithmetic, comparisons, logic.

Each is one short class whose `apply(o, *xs)` writes its math over an ops handler (see
`handler.py`), so the same description is the numpy reference, the torch lowering and the
Triton code. All inputs must have the same lens (the frontend inserts `multibroadcast` first, as
MIGraphX does); the output is standard-strided with the first input's type, or `bool_type` for
comparisons and logic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from pygraphx.ir.shape import Shape, to_dtype
from pygraphx.ops.base import Op, ShapeError, ViewOp, check_arity, register_op
from pygraphx.ops.handler import NUMPY, compute_dtype


class Pointwise(Op):
    """Base of element-wise operators."""

    arity: ClassVar[int] = 1
    # output type: None = same as input 0, else a type name
    out_type: ClassVar[str | None] = None
    # all inputs must share one type (false for e.g. where's condition, pow's exponent)
    same_type: ClassVar[bool] = True

    def apply(self, o: Any, *xs: Any) -> Any:
        raise NotImplementedError

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, self.arity)
        lens = inputs[0].lens()
        for s in inputs[1:]:
            if s.lens() != lens:
                raise ShapeError(
                    f"{self.name}: inputs have different lens "
                    f"{[x.lens() for x in inputs]} (broadcast them first)"
                )
        if self.same_type and len({s.type() for s in inputs}) > 1:
            raise ShapeError(
                f"{self.name}: inputs have different types {[s.type() for s in inputs]}"
            )
        return Shape(self.out_type or self.result_type(inputs), lens)

    def result_type(self, inputs: Sequence[Shape]) -> str:
        return inputs[0].type()

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        # half, bf16 and fp8 compute the whole op in float32 and round once, as the ONNX
        # reference does, instead of rounding after every primitive (the one rule, handler.py)
        wide = [a.astype(compute_dtype(a.dtype), copy=False) for a in args]
        with np.errstate(all="ignore"):
            out = self.apply(NUMPY, *wide)
        return np.asarray(out).astype(output_shape.dtype(), copy=False)


def _unary(op_name: str, fn: str, out_type: str | None = None) -> type[Pointwise]:
    def apply(self: Pointwise, o: Any, x: Any) -> Any:
        return getattr(o, fn)(x)

    attrs = {"name": op_name, "apply": apply, "out_type": out_type}
    cls = type(op_name.capitalize(), (Pointwise,), attrs)
    cls.__module__ = __name__
    cls.__qualname__ = cls.__name__
    return register_op(cls)


def _binary(op_name: str, fn: str, out_type: str | None = None) -> type[Pointwise]:
    def apply(self: Pointwise, o: Any, x: Any, y: Any) -> Any:
        return getattr(o, fn)(x, y)

    attrs = {"name": op_name, "apply": apply, "arity": 2, "out_type": out_type}
    cls = type(op_name.capitalize(), (Pointwise,), attrs)
    cls.__module__ = __name__
    cls.__qualname__ = cls.__name__
    return register_op(cls)


# op name -> ops handler method, one per line
UNARY = {
    "abs": "abs", "neg": "neg", "sign": "sign", "floor": "floor", "ceil": "ceil",
    "round": "round", "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "recip": "recip", "erf": "erf", "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin",
    "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh",
    "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "sigmoid": "sigmoid",
}  # fmt: skip
BINARY = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "max": "maximum",
    "min": "minimum", "fmod": "fmod", "mod": "mod",
}  # fmt: skip
BITWISE = {"bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor"}
COMPARE = {
    "equal": "equal", "less": "less", "greater": "greater", "less_or_equal": "less_equal",
    "greater_or_equal": "greater_equal", "logical_and": "logical_and",
    "logical_or": "logical_or", "logical_xor": "logical_xor",
}  # fmt: skip

for _name, _fn in UNARY.items():
    _unary(_name, _fn)
for _name, _fn in {**BINARY, **BITWISE}.items():
    _binary(_name, _fn)
for _name, _fn in COMPARE.items():
    _binary(_name, _fn, out_type="bool_type")


@register_op
class Not(Pointwise):
    name = "not"

    def apply(self, o: Any, x: Any) -> Any:
        return o.logical_not(x) if x.dtype == np.bool_ else o.bitwise_not(x)

    def result_type(self, inputs: Sequence[Shape]) -> str:
        return inputs[0].type()


#: true where the element is nan / +inf or -inf
Isnan = _unary("isnan", "isnan", out_type="bool_type")
Isinf = _unary("isinf", "isinf", out_type="bool_type")


@register_op
class Relu(Pointwise):
    name = "relu"

    def apply(self, o: Any, x: Any) -> Any:
        return o.maximum(x, o.constant(0, x))


@register_op
class LeakyRelu(Pointwise):
    name = "leaky_relu"
    alpha: float = 0.01

    def apply(self, o: Any, x: Any) -> Any:
        return o.where(o.greater(x, o.constant(0, x)), x, o.mul(x, o.constant(self.alpha, x)))


@register_op
class Elu(Pointwise):
    name = "elu"
    alpha: float = 1.0

    def apply(self, o: Any, x: Any) -> Any:
        neg = o.mul(o.constant(self.alpha, x), o.sub(o.exp(x), o.constant(1, x)))
        return o.where(o.greater(x, o.constant(0, x)), x, neg)


@register_op
class Pow(Pointwise):
    name = "pow"
    arity = 2
    same_type = False

    def apply(self, o: Any, x: Any, y: Any) -> Any:
        return o.pow(x, o.cast(y, x.dtype))


@register_op
class Where(Pointwise):
    """where(cond, a, b): `a` where cond is true, else `b`; output type is `a`'s."""

    name = "where"
    arity = 3
    same_type = False

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        out = super().compute_shape(inputs)
        if inputs[0].type() != "bool_type":
            raise ShapeError(f"where: condition must be bool_type, got {inputs[0].type()}")
        if inputs[1].type() != inputs[2].type():
            raise ShapeError(
                f"where: branches differ in type {inputs[1].type()}, {inputs[2].type()}"
            )
        return Shape(inputs[1].type(), out.lens())

    def apply(self, o: Any, c: Any, x: Any, y: Any) -> Any:
        return o.where(c, x, y)


@register_op
class Clip(Pointwise):
    """clip(x, lo, hi) = min(max(x, lo), hi)."""

    name = "clip"
    arity = 3

    def apply(self, o: Any, x: Any, lo: Any, hi: Any) -> Any:
        return o.minimum(o.maximum(x, lo), hi)


@register_op
class Convert(Pointwise):
    """Cast to `target_type` (float -> int truncates; out-of-range follows numpy).

    With `clamp=True` (the default: the converts `quantize_fp16` / `quantize_bf16` and the
    passes insert), a finite value beyond the range of float16, bfloat16 or float32 (from a
    type with a wider range) becomes the target's largest finite value with its sign instead of
    an infinity, as MIGraphX's `convert` clamps to the target's [lowest, max]; the infinities and
    NaN stay what they are (MIGraphX sends the infinities to the bounds too). ONNX Cast makes
    `clamp=False`: the IEEE result (an infinity), as ONNX Runtime gives. To an fp8 type,
    out-of-range values overflow as ml_dtypes does (ONNX Cast's `saturate=0`);
    `convert_saturate` below is the saturating cast.
    """

    name = "convert"
    target_type: str = "float_type"
    clamp: bool = True
    same_type = False

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 1)
        return Shape(self.target_type, inputs[0].lens())

    def attributes(self) -> dict[str, Any]:
        """`clamp` only when off (ONNX Cast's): MIGraphX prints `convert[target_type=...]`."""
        attrs = super().attributes()
        if self.clamp:
            del attrs["clamp"]
        return attrs

    def apply(self, o: Any, x: Any) -> Any:
        dtype = to_dtype(self.target_type)
        src = np.dtype(x.dtype)
        if not self.clamp or overflow_bound(src, dtype) is None:
            return o.cast(x, dtype)
        if src not in _WIDE_FLOATS:  # integers, bfloat16: clamped in float32, where the bound
            x = o.cast(x, np.float32)  # and every value up to it are exact (65504 < 2**24)
        return o.cast_finite(x, dtype)


_WIDE_FLOATS = frozenset(np.dtype(t) for t in (np.float32, np.float64))
#: the types `convert` clamps finite overflow to (see `Convert`)
CLAMPED_TARGETS = frozenset(np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32))


def overflow_bound(src: np.dtype, dst: np.dtype) -> float | None:
    """The largest finite value of `dst` when a value of `src` can exceed it and `convert`
    clamps to it, else None."""
    if np.dtype(dst) not in CLAMPED_TARGETS:
        return None
    top = float(ml_dtypes.finfo(dst).max)
    if src.kind in "iu":
        return top if np.iinfo(src).max > top else None
    if src.kind == "f" or src == np.dtype(ml_dtypes.bfloat16):
        return top if float(ml_dtypes.finfo(src).max) > top else None
    return None


#: the fp8 types, the only targets of `convert_saturate`
FP8_TYPES = ("fp8e4m3fnuz_type", "fp8e4m3fn_type", "fp8e5m2_type", "fp8e5m2fnuz_type")
# source types a saturating convert clamps in directly; others (integers, bool, fp8) are widened
# to float32 first (every fp8 maximum is exact there, and no fp8 bound fits an int8)
_CLAMP_DTYPES = frozenset(
    np.dtype(t) for t in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16)
)


@register_op
class ConvertSaturate(Pointwise):
    """Cast to the fp8 `target_type`, saturating: ONNX Cast's `saturate=1` (opset 19+).

    Finite values beyond the type's largest finite value and the infinities become that value
    (with their sign), NaN stays NaN, everything else rounds to nearest even. `convert` to an
    fp8 type keeps numpy's (ml_dtypes') overflow instead: NaN for the e4m3 and fnuz types, inf
    for e5m2 (ONNX's `saturate=0`).
    """

    name = "convert_saturate"
    target_type: str = "fp8e4m3fn_type"
    same_type = False

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 1)
        if self.target_type not in FP8_TYPES:
            raise ShapeError(
                f"{self.name}: target_type must be an fp8 type ({', '.join(FP8_TYPES)}), "
                f"got {self.target_type}"
            )
        return Shape(self.target_type, inputs[0].lens())

    def apply(self, o: Any, x: Any) -> Any:
        dtype = to_dtype(self.target_type)
        if np.dtype(x.dtype) not in _CLAMP_DTYPES:
            x = o.cast(x, np.float32)
        big = float(ml_dtypes.finfo(dtype).max)
        clamped = o.minimum(o.maximum(x, o.constant(-big, x)), o.constant(big, x))
        return o.cast(o.where(o.isnan(x), x, clamped), dtype)


@register_op
class Contiguous(Op):
    """A packed, row-major copy of its input."""

    name = "contiguous"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 1)
        return Shape(inputs[0].type(), inputs[0].lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        return np.asarray(args[0], order="C")


@register_op
class Identity(ViewOp):
    """The input itself (a view)."""

    name = "identity"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 1)
        return inputs[0]

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        return args[0]
