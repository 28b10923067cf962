"""propagate_constant: evaluate at compile time what depends only on literals (constant folding).

Every instruction computable from literals alone is found; those whose value is still needed by
runtime instructions (the frontier) are evaluated with the reference semantics and replaced by
one literal each. A broadcast on the frontier is not materialised (that would store a large
repeated tensor): its input is folded instead and the broadcast view stays.
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.passes.dead_code_elimination import dead_code_elimination

_NEVER_FOLD = {"@param", "@return", "@literal", "unknown"}


def _is_broadcast_view(ins: Instruction) -> bool:
    return ins.op.output_alias(len(ins.inputs)) >= 0 and ins.shape.broadcasted()


def propagate_constant(module: Module) -> None:
    """Fold constant sub-graphs into literals."""
    const: set[int] = set()
    for ins in module.instructions:
        if ins.is_literal():
            const.add(id(ins))
        elif (
            ins.op.name not in _NEVER_FOLD
            and not ins.module_inputs
            and ins.inputs
            and all(id(i) in const for i in ins.inputs)
        ):
            const.add(id(ins))
    frontier: list[Instruction] = []
    for ins in module.instructions:
        if id(ins) not in const or ins.is_literal():
            continue
        if any(id(u) not in const for u in ins.outputs):
            if _is_broadcast_view(ins):
                frontier.extend(i for i in ins.inputs if not i.is_literal())
            else:
                frontier.append(ins)
    if not frontier:
        return
    values: dict[int, np.ndarray] = {}

    def value(ins: Instruction) -> np.ndarray:
        if ins.is_literal():
            return ins.get_literal().array
        if id(ins) not in values:
            values[id(ins)] = ins.op.compute(ins.shape, [value(i) for i in ins.inputs])
        return values[id(ins)]

    done: set[int] = set()
    for ins in frontier:
        if id(ins) in done:
            continue
        done.add(id(ins))
        arr = np.asarray(value(ins), order="C")
        lit = module.insert_literal(ins, Literal(arr))
        module.replace_instruction(ins, lit)
    dead_code_elimination(module)
