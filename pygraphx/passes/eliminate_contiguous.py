"""eliminate_contiguous: drop `contiguous` copies of values that are already standard.

A target that needs packed inputs inserts `contiguous` where a view would not do; when the
value is already standard (row-major and packed) the copy does nothing and is removed.
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.passes.rewrite import Rule, apply_to_fixed_point


def contiguous_standard(m: Module, ins: Instruction) -> Instruction | None:
    # contiguous(x) -> x when x is already standard
    x = ins.inputs[0]
    return x if x.shape.standard() and not x.shape.broadcasted() else None


RULES: dict[str, list[Rule]] = {"contiguous": [contiguous_standard]}  # contiguous(std x) -> x


def eliminate_contiguous(module: Module) -> None:
    """Remove contiguous copies of standard values."""
    apply_to_fixed_point(module, RULES)
