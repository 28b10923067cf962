"""Miscellaneous operators: `einsum`, `det` and `bitshift` (`isinf` is in pointwise.py).

`einsum[equation]` is one operator computed with `np.einsum` (the frontend may later decompose
it into transpose/dot/reduce); its output shape comes from parsing the equation here, ellipsis
and implicit output included. `det` is the determinant over the last two dimensions.
`bitshift[direction]` shifts integers by a per-element amount; a shift outside [0, bit width)
gives 0, or -1 for a right shift of a negative value, as ONNX specifies (numpy's saturating
behaviour, not C's masking).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pygraphx.ir.shape import FLOAT_TYPES, Shape
from pygraphx.ops.base import OneInputOp, Op, ShapeError, check_arity, check_same_type, register_op
from pygraphx.ops.broadcast import broadcast_lens


def _narrow_float(dtype: np.dtype) -> bool:
    """True for the float types computed in float32 here: float16 and the ml_dtypes ones."""
    return (dtype.kind == "f" and dtype.itemsize < 4) or dtype.kind == "V"


# --- einsum -----------------------------------------------------------------------------------
def parse_einsum(equation: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """Split an einsum equation into one label string per input and the output labels.

    Labels are letters; an ellipsis is written as `.` repeated for as many dimensions as it
    stands for in that operand, so every label string has exactly one character per dimension.
    The output is the explicit right-hand side or, without `->`, numpy's implicit one (the
    ellipsis dimensions, then the labels used once, in alphabetical order).
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ShapeError(
            f"einsum: equation {equation!r} has {len(terms)} operand(s), got {len(ranks)} inputs"
        )
    ell_rank = 0
    ell_ranks = []
    for term, rank in zip(terms, ranks, strict=True):
        letters = term.replace("...", "")
        if not all(c.isalpha() for c in letters) or term.count("...") > 1:
            raise ShapeError(f"einsum: operand {term!r} of {equation!r} is malformed")
        n = rank - len(letters)
        if n < 0 or (n > 0 and "..." not in term):
            raise ShapeError(
                f"einsum: operand {term!r} of {equation!r} does not match an input of rank {rank}"
            )
        ell_ranks.append(n)
        ell_rank = max(ell_rank, n)
    labels = [t.replace("...", "." * n) for t, n in zip(terms, ell_ranks, strict=True)]
    if arrow:
        out_letters = rhs.replace("...", "")
        if not all(c.isalpha() for c in out_letters) or rhs.count("...") > 1:
            raise ShapeError(f"einsum: output {rhs!r} of {equation!r} is malformed")
        if len(set(out_letters)) != len(out_letters):
            raise ShapeError(f"einsum: output {rhs!r} of {equation!r} repeats a label")
        used = set("".join(labels))
        missing = [c for c in out_letters if c not in used]
        if missing:
            raise ShapeError(f"einsum: output labels {missing} of {equation!r} are not inputs")
        if ell_rank and "..." not in rhs:
            raise ShapeError(f"einsum: the output of {equation!r} drops the ellipsis dimensions")
        out = rhs.replace("...", "." * ell_rank)
    else:
        joined = "".join(t.replace(".", "") for t in labels)
        once = sorted(c for c in set(joined) if joined.count(c) == 1)
        out = "." * ell_rank + "".join(once)
    return labels, out


def einsum_lens(equation: str, inputs: Sequence[Sequence[int]]) -> list[int]:
    """The output lens of `equation` applied to inputs of the given lens."""
    labels, out = parse_einsum(equation, [len(x) for x in inputs])
    sizes: dict[str, int] = {}
    ellipses = []
    for term, lens in zip(labels, inputs, strict=True):
        ellipses.append([n for c, n in zip(term, lens, strict=True) if c == "."])
        for c, n in zip(term, lens, strict=True):
            if c == ".":
                continue
            if sizes.setdefault(c, n) != n:
                raise ShapeError(
                    f"einsum: label {c!r} of {equation!r} has lengths {sizes[c]} and {n}"
                )
    try:
        ell = broadcast_lens(*ellipses)
    except ShapeError:
        raise ShapeError(
            f"einsum: the ellipsis dimensions {ellipses} of {equation!r} do not broadcast"
        ) from None
    ell_iter = iter(ell)
    return [next(ell_iter) if c == "." else sizes[c] for c in out]


@register_op
class Einsum(Op):
    """Einstein summation over the inputs, as `np.einsum(equation, *inputs)`."""

    name = "einsum"
    equation: str = ""

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        if not inputs:
            raise ShapeError("einsum: expected at least one input")
        check_same_type(self, inputs)
        return Shape(inputs[0].type(), einsum_lens(self.equation, [s.lens() for s in inputs]))

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        arrays = [np.asarray(a) for a in args]
        if arrays and _narrow_float(arrays[0].dtype):
            arrays = [a.astype(np.float32) for a in arrays]
        out = np.einsum(self.equation.replace(" ", ""), *arrays)
        return np.array(out, dtype=output_shape.dtype(), copy=True)


# --- det --------------------------------------------------------------------------------------
@register_op
class Det(OneInputOp):
    """Determinant of the square matrices in the last two dimensions: [..., M, M] -> [...]."""

    name = "det"

    def shape_for(self, s: Shape) -> Shape:
        lens = s.lens()
        if len(lens) < 2 or lens[-1] != lens[-2]:
            raise ShapeError(f"det: input {lens} is not a (batch of) square matrices [..., M, M]")
        if s.type() not in FLOAT_TYPES:
            raise ShapeError(f"det: input type {s.type()} is not a floating-point type")
        return Shape(s.type(), lens[:-2])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = np.asarray(args[0])
        if _narrow_float(x.dtype):
            x = x.astype(np.float32)
        if x.shape[-1] == 0:
            return np.ones(output_shape.lens(), output_shape.dtype())
        return np.asarray(np.linalg.det(x)).astype(output_shape.dtype())


# --- bitshift ---------------------------------------------------------------------------------
def bitshift(x: np.ndarray, y: np.ndarray, left: bool) -> np.ndarray:
    """`x << y` or `x >> y` (arithmetic for signed types) with ONNX's out-of-range rule."""
    width = x.dtype.itemsize * 8
    amount = y.astype(np.int64)  # uint64 amounts >= 2**63 wrap negative: out of range too
    valid = (amount >= 0) & (amount < width)
    safe = np.where(valid, amount, 0).astype(x.dtype)
    if left:
        out = np.where(valid, np.left_shift(x, safe), np.zeros((), x.dtype))
    else:
        fill = np.where(x < 0, np.asarray(-1).astype(x.dtype), np.zeros((), x.dtype))
        out = np.where(valid, np.right_shift(x, safe), fill)
    return out.astype(x.dtype, copy=False)


@register_op
class Bitshift(Op):
    """Element-wise `x << y` (`direction="left"`) or `x >> y` (`"right"`) on unsigned or
    signed integers of one type and equal lens (out-of-range shifts as ONNX: see module)."""

    name = "bitshift"
    direction: str = "left"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2)
        check_same_type(self, inputs)
        a, b = inputs
        if a.lens() != b.lens():
            raise ShapeError(
                f"bitshift: inputs have different lens {a.lens()} and {b.lens()} "
                "(broadcast them first)"
            )
        if a.dtype().kind not in "iu":
            raise ShapeError(f"bitshift: type {a.type()} is not an integer type")
        if self.direction not in ("left", "right"):
            raise ShapeError(
                f"bitshift: direction must be 'left' or 'right', not {self.direction!r}"
            )
        return Shape(a.type(), a.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, y = (np.asarray(a) for a in args)
        return bitshift(x, y, self.direction == "left")
