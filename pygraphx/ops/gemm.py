"""Matrix multiplication: `dot` (same-type batched matmul) and `quant_dot` (int8 inputs).

Both follow MIGraphX: the inputs have the same rank (at least 2) and *equal* batch dimensions;
the frontend multibroadcasts the batch dimensions first (numpy's rules), as MIGraphX's ONNX
parser does, so the operators never broadcast themselves. The output is standard-strided with
lens `batch + [M, N]`.

Numerics: float32 products accumulate in float32 through numpy's BLAS (`np.matmul`), as ONNX
Runtime's CPU provider does; half, bf16 and fp8 inputs accumulate in float32 and round once at
the end. Integer products accumulate exactly and wrap to the output type, which is the result of
accumulating in that type with two's-complement overflow.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pygraphx.ir.shape import FLOAT_TYPES, Shape
from pygraphx.ops.base import Op, ShapeError, check_arity, register_op

# types accumulated in float32 and rounded once to the output type
_LOW_PRECISION_FLOATS = frozenset(FLOAT_TYPES - {"float_type", "double_type"})
_QUANT_INT_TYPES = frozenset({"int8_type", "uint8_type"})
_QUANT_FP8_TYPES = frozenset(t for t in FLOAT_TYPES if t.startswith("fp8"))


def matmul_lens(op: Op, a: Shape, b: Shape) -> list[int]:
    """The output lens of `a @ b` under `dot`'s rules; raises ShapeError naming the mismatch."""
    al, bl = a.lens(), b.lens()
    if a.ndim() < 2 or b.ndim() < 2:
        raise ShapeError(
            f"{op.name}: inputs must have rank 2 or more, got {al} and {bl} "
            "(1-D operands are unsqueezed by the frontend)"
        )
    if a.ndim() != b.ndim():
        raise ShapeError(
            f"{op.name}: inputs must have the same rank, got {al} and {bl} "
            "(multibroadcast the batch dimensions first)"
        )
    if al[:-2] != bl[:-2]:
        raise ShapeError(
            f"{op.name}: batch dimensions differ, {al[:-2]} vs {bl[:-2]} "
            "(multibroadcast them to a common shape first)"
        )
    if al[-1] != bl[-2]:
        raise ShapeError(
            f"{op.name}: inner dimensions differ: {al} x {bl} "
            f"(a's last dimension {al[-1]} != b's second-to-last {bl[-2]})"
        )
    return al[:-1] + bl[-1:]


def _int_matmul(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    """Integer matmul, exact, wrapped to `out_dtype` (two's-complement accumulation)."""
    k = a.shape[-1]
    bound_a = max(abs(int(np.iinfo(a.dtype).min)), int(np.iinfo(a.dtype).max))
    bound_b = max(abs(int(np.iinfo(b.dtype).min)), int(np.iinfo(b.dtype).max))
    if k * bound_a * bound_b < 2**53:
        # every partial sum is an integer below 2**53: float64 BLAS is exact and fast
        out = np.rint(np.matmul(a.astype(np.float64), b.astype(np.float64)))
        return out.astype(np.int64).astype(out_dtype)
    # wide types: exact modulo 2**64, which is all the wrapped result needs
    with np.errstate(over="ignore"):
        return np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(out_dtype)


@register_op
class Dot(Op):
    """Batched matrix product of two same-type inputs with equal batch dimensions."""

    name = "dot"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2)
        a, b = inputs
        if a.type() != b.type():
            raise ShapeError(f"{self.name}: inputs have different types {a.type()} and {b.type()}")
        if a.type() == "bool_type":
            raise ShapeError(f"{self.name}: bool_type inputs are not supported")
        return Shape(a.type(), matmul_lens(self, a, b))

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        a, b = args
        out_dtype = output_shape.dtype()
        type_name = output_shape.type()
        if type_name in _LOW_PRECISION_FLOATS:
            out = np.matmul(a.astype(np.float32), b.astype(np.float32))
            return out.astype(out_dtype)
        if np.issubdtype(out_dtype, np.integer):
            return _int_matmul(a, b, out_dtype)
        return np.asarray(np.matmul(a, b), dtype=out_dtype)


@register_op
class QuantDot(Op):
    """Quantized matmul: int8/uint8 inputs accumulate into int32; fp8 inputs into float.

    The two inputs may mix int8 and uint8 (as ONNX MatMulInteger allows); fp8 inputs must be
    the same type.
    """

    name = "quant_dot"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2)
        a, b = inputs
        types = (a.type(), b.type())
        if all(t in _QUANT_INT_TYPES for t in types):
            out_type = "int32_type"
        elif all(t in _QUANT_FP8_TYPES for t in types) and a.type() == b.type():
            out_type = "float_type"
        else:
            raise ShapeError(
                f"{self.name}: inputs must be int8/uint8 or one fp8 type, got {types[0]} "
                f"and {types[1]}"
            )
        return Shape(out_type, matmul_lens(self, a, b))

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        a, b = args
        if output_shape.type() == "int32_type":
            return _int_matmul(a, b, np.dtype(np.int32))
        return np.matmul(a.astype(np.float32), b.astype(np.float32))
