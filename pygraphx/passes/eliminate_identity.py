"""eliminate_identity: remove `identity` instructions (their users read the input directly)."""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.passes.rewrite import Rule, apply_to_fixed_point


def identity_op(m: Module, ins: Instruction) -> Instruction | None:
    return ins.inputs[0]


RULES: dict[str, list[Rule]] = {"identity": [identity_op]}  # identity(x) -> x


def eliminate_identity(module: Module) -> None:
    """Replace every identity by its input."""
    apply_to_fixed_point(module, RULES)
