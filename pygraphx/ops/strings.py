"""String operators over `string_type` tensors (numpy object arrays of Python `str`).

- `string_concat(a, b)`: element-wise `a + b` (inputs already broadcast to one lens);
- `regex_full_match[pattern]`: element-wise, whether the whole string matches `pattern`
  (Python's `re`, which accepts the RE2 patterns ONNX's tests use), a bool tensor.

ONNX's StringNormalizer and StringSplit give outputs whose lens depend on the strings
themselves; `string_normalize` and `string_split` below compute them, and the frontend applies
them to values known at compile time (a program is built per input value when the strings are
graph inputs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from pygraphx.ir.shape import Shape
from pygraphx.ops.base import Op, ShapeError, check_arity, register_op

STRING = "string_type"


def _check_strings(op: Op, inputs: Sequence[Shape]) -> None:
    for k, s in enumerate(inputs):
        if s.type() != STRING:
            raise ShapeError(f"{op.name}: input {k} is {s.type()}, not a string tensor")


@register_op
class StringConcat(Op):
    """`a + b` per element, both string tensors of the same lens."""

    name = "string_concat"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2)
        _check_strings(self, inputs)
        if inputs[0].lens() != inputs[1].lens():
            raise ShapeError(f"{self.name}: lens {inputs[0].lens()} != {inputs[1].lens()}")
        return Shape(STRING, inputs[0].lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        flat = [str(a) + str(b) for a, b in zip(args[0].ravel(), args[1].ravel(), strict=True)]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(output_shape.lens())


@register_op
class RegexFullMatch(Op):
    """Whether each whole string matches `pattern`."""

    name = "regex_full_match"
    pattern: str = ""

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 1)
        _check_strings(self, inputs)
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ShapeError(f"{self.name}: bad pattern {self.pattern!r}: {exc}") from None
        return Shape("bool_type", inputs[0].lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        rx = re.compile(self.pattern)
        flat = [rx.fullmatch(str(s)) is not None for s in np.asarray(args[0]).ravel()]
        return np.array(flat, dtype=np.bool_).reshape(output_shape.lens())


def string_normalize(
    x: np.ndarray, case_change: str, case_sensitive: bool, stopwords: Sequence[str]
) -> np.ndarray:
    """ONNX StringNormalizer on a [C] or [1, C] tensor: stopwords removed (compared ignoring
    case unless `case_sensitive`), then LOWER/UPPER/NONE applied; empty strings are dropped
    and an all-empty result is one empty string."""
    x = np.asarray(x, dtype=object)
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
        raise ValueError(f"StringNormalizer takes [C] or [1, C] strings, got lens {list(x.shape)}")
    fold = (lambda s: s) if case_sensitive else str.lower
    stops = {fold(w) for w in stopwords}
    change = {"LOWER": str.lower, "UPPER": str.upper, "NONE": lambda s: s}.get(case_change)
    if change is None:
        raise ValueError(f"case_change_action {case_change!r} is not LOWER, UPPER or NONE")
    kept = [change(str(s)) for s in x.ravel() if fold(str(s)) not in stops]
    kept = [s for s in kept if s] or [""]
    out = np.empty(len(kept), dtype=object)
    out[:] = kept
    return out.reshape(1, -1) if x.ndim == 2 else out


def string_split(
    x: np.ndarray, delimiter: str | None, maxsplit: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """ONNX StringSplit: each string split on `delimiter` (runs of whitespace when None or
    empty) at most `maxsplit` times, padded with empty strings to the longest split (a new last
    dimension), and the number of parts of each string (int64)."""
    x = np.asarray(x, dtype=object)
    sep = delimiter or None
    limit = -1 if maxsplit is None else int(maxsplit)
    parts = [str(s).split(sep, limit) for s in x.ravel()]
    counts = np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    width = max((len(p) for p in parts), default=0)
    out = np.empty((len(parts), width), dtype=object)
    for k, p in enumerate(parts):
        out[k, :] = p + [""] * (width - len(p))
    return out.reshape(*x.shape, width), counts
