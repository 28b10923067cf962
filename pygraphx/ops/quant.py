"""Linear quantisation operators: `quantizelinear` and `dequantizelinear`.

As in MIGraphX, both take their scale (and optional zero point) already broadcast to the input's
lens: the frontend builds per-tensor, per-axis and blocked layouts out of broadcast views, so the
operators themselves are element-wise.

- `quantizelinear(x, scale[, zero_point])`: `saturate(rint(x / scale) + zero_point)` for the
  integer types (uint8, int8, uint16, int16, and ONNX's 4-bit and 2-bit ones: round half to even,
  then clamp to the type's range), and `fp8(x / scale + zero_point)` for the fp8 types (and fp4
  e2m1, which has no overflow value and always saturates), rounding to nearest even; `saturate=1`
  clamps out-of-range values (infinities included) to the largest finite value, `saturate=0`
  gives what the type has for overflow (NaN for the e4m3 types, inf for e5m2, NaN for fnuz).
  The output type is the zero point's, or `out_type` without one.
- `dequantizelinear(x, scale[, zero_point])`: `(x - zero_point) * scale` in the scale's type.

Arithmetic is float32 (float64 when an input is double), as ONNX Runtime's CPU kernels compute
it; the quotient is rounded once, from float32, to the target type.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

from pygraphx.ir.shape import FLOAT_TYPES, Shape, from_dtype
from pygraphx.ops.base import Op, ShapeError, check_arity, register_op

#: integer quantised types -> their saturation range
INT_RANGES: dict[str, tuple[int, int]] = {
    "uint8_type": (0, 255),
    "int8_type": (-128, 127),
    "uint16_type": (0, 65535),
    "int16_type": (-32768, 32767),
    "uint4_type": (0, 15),
    "int4_type": (-8, 7),
    "uint2_type": (0, 3),
    "int2_type": (-2, 1),
}
FP8_TYPES = frozenset(t for t in FLOAT_TYPES if t.startswith("fp8") and t != "fp8e8m0_type")
#: low-precision float types quantizelinear rounds to (fp8, and ONNX's fp4 e2m1)
QUANT_FLOAT_TYPES = FP8_TYPES | {"fp4e2m1_type"}
QUANT_TYPES = frozenset(INT_RANGES) | QUANT_FLOAT_TYPES
#: types `x` of quantizelinear may have
QUANTIZE_INPUT_TYPES = frozenset(
    {"float_type", "half_type", "bf16_type", "double_type", "int32_type"}
)
#: types a scale may have
SCALE_TYPES = frozenset({"float_type", "half_type", "bf16_type", "double_type"})
#: types `x` of dequantizelinear may have
DEQUANTIZE_INPUT_TYPES = QUANT_TYPES | {"int32_type"}


def _compute_dtype(*arrays: np.ndarray) -> type:
    return np.float64 if any(a.dtype == np.float64 for a in arrays) else np.float32


def fp8_max(dtype: np.dtype) -> float:
    """The largest finite value of an fp8 dtype."""
    return float(ml_dtypes.finfo(dtype).max)


def quantize(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    out_dtype: np.dtype,
    saturate: bool = True,
) -> np.ndarray:
    """The reference semantics of `quantizelinear` on broadcast-compatible numpy arrays."""
    ct = _compute_dtype(x, scale)
    with np.errstate(all="ignore"):
        q = np.asarray(x).astype(ct) / np.asarray(scale).astype(ct)
        type_name = from_dtype(out_dtype)
        if type_name in INT_RANGES:
            lo, hi = INT_RANGES[type_name]
            q = np.rint(q)
            if zero_point is not None:
                q = q + np.asarray(zero_point).astype(ct)
            q = np.where(np.isnan(q), lo, np.clip(q, lo, hi))  # NaN saturates low, as in ORT
            return q.astype(out_dtype)
        if zero_point is not None:
            zp = np.asarray(zero_point).astype(ct)
            q = np.where(zp == 0, q, q + zp)  # adding +0 would turn -0 into +0
        if saturate:
            big = fp8_max(out_dtype)
            q = np.clip(q, -big, big)  # NaN stays NaN
        return np.asarray(q).astype(out_dtype)


def dequantize(
    x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, out_dtype: np.dtype
) -> np.ndarray:
    """The reference semantics of `dequantizelinear` on broadcast-compatible numpy arrays."""
    ct = _compute_dtype(scale)
    x = np.asarray(x)
    if zero_point is not None and x.dtype.kind in "iu":
        d = (x.astype(np.int64) - np.asarray(zero_point).astype(np.int64)).astype(ct)
    elif zero_point is not None:
        d = x.astype(ct) - np.asarray(zero_point).astype(ct)
    else:
        d = x.astype(ct)
    return (d * np.asarray(scale).astype(ct)).astype(out_dtype)


def _check_params(op: Op, inputs: Sequence[Shape]) -> None:
    check_arity(op, inputs, 2, 3)
    lens = inputs[0].lens()
    if any(s.lens() != lens for s in inputs[1:]):
        raise ShapeError(
            f"{op.name}: scale and zero point must be broadcast to the input's lens {lens}, got "
            f"{[s.lens() for s in inputs[1:]]}"
        )
    if inputs[1].type() not in SCALE_TYPES:
        raise ShapeError(f"{op.name}: scale type {inputs[1].type()} is not a float type")


@register_op
class QuantizeLinear(Op):
    """`saturate(rint(x / scale) + zero_point)` into the zero point's type (or `out_type`)."""

    name = "quantizelinear"
    out_type: str = "uint8_type"
    saturate: bool = True

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        _check_params(self, inputs)
        x = inputs[0]
        if x.type() not in QUANTIZE_INPUT_TYPES:
            raise ShapeError(f"{self.name}: input type {x.type()} cannot be quantised")
        out_type = inputs[2].type() if len(inputs) == 3 else self.out_type
        if out_type not in QUANT_TYPES:
            raise ShapeError(
                f"{self.name}: {out_type} is not a quantised type "
                f"({', '.join(sorted(QUANT_TYPES))})"
            )
        return Shape(out_type, x.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        zp = args[2] if len(args) == 3 else None
        return quantize(args[0], args[1], zp, output_shape.dtype(), self.saturate)


@register_op
class DequantizeLinear(Op):
    """`(x - zero_point) * scale`, in the scale's type."""

    name = "dequantizelinear"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        _check_params(self, inputs)
        x = inputs[0]
        if x.type() not in DEQUANTIZE_INPUT_TYPES:
            raise ShapeError(f"{self.name}: input type {x.type()} is not a quantised type")
        if len(inputs) == 3 and inputs[2].type() != x.type():
            raise ShapeError(
                f"{self.name}: zero point type {inputs[2].type()} differs from the input's "
                f"{x.type()}"
            )
        return Shape(inputs[1].type(), x.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        zp = args[2] if len(args) == 3 else None
        return dequantize(args[0], args[1], zp, output_shape.dtype())
