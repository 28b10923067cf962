"""The rule engine shared by the rewriting passes (simplify_algebra, simplify_reshapes, ...).

A rule is `rule(module, ins) -> replacement | None`; rules are grouped by the operator name they
look at. One sweep tries each live instruction's rules in order and replaces it by the first
replacement offered; dead instructions are removed after the sweep.
"""

from __future__ import annotations

from collections.abc import Callable

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.passes.dead_code_elimination import dead_code_elimination

Rule = Callable[[Module, Instruction], Instruction | None]


def apply_rules(module: Module, rules: dict[str, list[Rule]]) -> bool:
    """One sweep of `rules`; True when something changed."""
    changed = False
    for ins in list(module.instructions):
        if not ins.outputs or ins.module is not module:
            continue
        for rule in rules.get(ins.op.name, ()):
            rep = rule(module, ins)
            if rep is not None and rep is not ins:
                module.replace_instruction(ins, rep)
                changed = True
                break
    dead_code_elimination(module)
    return changed


def apply_to_fixed_point(module: Module, rules: dict[str, list[Rule]], max_sweeps: int = 8) -> None:
    for _ in range(max_sweeps):
        if not apply_rules(module, rules):
            break
