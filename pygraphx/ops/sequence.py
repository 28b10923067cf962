"""Sequence support in the tensor-only IR: picking one element of a compile-time sequence.

The ONNX frontend resolves sequences at parse time (onnx/handlers/sequence.py): a sequence is a
list of instructions the parser keeps, so SequenceConstruct, SequenceInsert, ConcatFromSequence
and friends become plain tensor instructions. The one thing left for run time is an element
chosen by a run-time position (`SequenceAt(seq, i)` inside a loop body, say):
`sequence_at(position, e0, e1, ...)` returns `e[position]`; every element has the same shape,
and negative positions count from the end, as in ONNX.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pygraphx.ir.shape import Shape
from pygraphx.ops.base import Op, ShapeError, register_op


@register_op
class SequenceAt(Op):
    """`elements[position]` for a position known only at run time."""

    name = "sequence_at"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        if len(inputs) < 2:
            raise ShapeError(f"sequence_at: needs a position and elements, got {len(inputs)}")
        pos = inputs[0]
        if pos.type() not in ("int32_type", "int64_type") or pos.elements() != 1:
            raise ShapeError(f"sequence_at: the position must be one int32/int64 value, got {pos}")
        first = inputs[1]
        for s in inputs[2:]:
            if s.lens() != first.lens() or s.type() != first.type():
                raise ShapeError(
                    f"sequence_at: elements differ in shape ({first} and {s}); a run-time "
                    "position needs elements of one shape"
                )
        return first.as_standard()

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        elements = args[1:]
        n = len(elements)
        p = int(np.asarray(args[0]).reshape(-1)[0])
        if not -n <= p < n:
            raise IndexError(f"sequence_at: position {p} is out of range for {n} elements")
        return np.array(elements[p + n if p < 0 else p], order="C")
