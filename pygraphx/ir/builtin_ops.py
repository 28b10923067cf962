"""The special instructions of a module: `@param`, `@literal`, `@return`, and `unknown`.

They are operators like the others so that modules stay a flat list of instructions, but the
printer shows them MIGraphX's way (`x = @param:x`, `@literal{...}`, `@return(...)`) and the
evaluator treats them specially (parameters come from the caller, literals from the program).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.op import Op, register_op
from pygraphx.ir.shape import Shape


@register_op
class Param(Op):
    name = "@param"
    parameter: str = ""
    shape: Shape = dataclasses.field(default_factory=Shape)
    # the dynamic shape users may feed; `shape` is then its maximum, which the body is built for
    dynamic_shape: Shape | None = None

    def attributes(self) -> dict:
        attrs = super().attributes()
        if self.dynamic_shape is None:
            del attrs["dynamic_shape"]
        return attrs

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        return self.shape


@register_op
@dataclasses.dataclass(frozen=True, eq=False)
class LiteralOp(Op):
    """A constant. Compared by identity: two literals are merged only by CSE, by value."""

    name = "@literal"
    literal: Literal = None  # type: ignore[assignment]

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        return self.literal.get_shape()

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        return self.literal.array

    def __hash__(self) -> int:
        return id(self)


@register_op
class Return(Op):
    name = "@return"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        return Shape("float_type", [])  # tuple of the inputs; never used as a value


@register_op
class Unknown(Op):
    """An ONNX node kept with `skip_unknown_operators=True`; running it raises."""

    name = "unknown"
    op: str = ""
    domain: str = ""
    output_shape: Shape = dataclasses.field(default_factory=Shape)

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        return self.output_shape

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        raise RuntimeError(
            f"unknown ONNX operator {self.domain or 'ai.onnx'}::{self.op} was skipped at parse "
            "time (skip_unknown_operators=True) and cannot be run"
        )

    def __str__(self) -> str:
        return f"unknown:{self.op}"
