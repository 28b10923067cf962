"""eliminate_contiguous: drop `contiguous` copies of values that are already standard.

A target that needs packed inputs inserts `contiguous` where a view would not do; when the
value is already standard (row-major and packed) the copy does nothing and is removed.
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.passes.pattern import Captures, Rule, RuleSet, any_, op


def _x(m: Module, ins: Instruction, c: Captures) -> Instruction:
    return c["x"]


def _standard(ins: Instruction) -> bool:
    return ins.shape.standard() and not ins.shape.broadcasted()


# contiguous(x) -> x when x is already standard
RULES = RuleSet("eliminate_contiguous", [
    Rule("contiguous_standard", op("contiguous", any_("x").where(_standard)), _x),
])  # fmt: skip


def eliminate_contiguous(module: Module) -> None:
    """Remove contiguous copies of standard values."""
    RULES.apply(module)
