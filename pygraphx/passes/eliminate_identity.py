"""eliminate_identity: remove `identity` instructions (their users read the input directly)."""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.passes.pattern import Captures, Rule, RuleSet, any_, op


def _x(m: Module, ins: Instruction, c: Captures) -> Instruction:
    return c["x"]


# identity(x) -> x
RULES = RuleSet("eliminate_identity", [Rule("identity", op("identity", any_("x")), _x)])


def eliminate_identity(module: Module) -> None:
    """Replace every identity by its input."""
    RULES.apply(module)
