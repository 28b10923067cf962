"""dead_code_elimination: remove instructions whose values nothing uses.

Walks the module backwards from its `@return` (or its last instruction); parameters are kept so
the program's signature never changes. Sub-modules (If/Loop/Scan bodies, fused groups) may read
values of this module directly: a live instruction's sub-modules count as uses of every value
they read, so an instruction used only inside an If body stays. When an instruction with
sub-modules dies, the sub-modules that read values of this module (and no live instruction
still calls) are emptied, so no module is left referring to a removed instruction; the frontend
then drops them from the program.
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction, reachable
from pygraphx.ir.module import Module


def _nested(modules: list[Module]) -> list[Module]:
    """`modules` and every module their instructions call, each once."""
    return list(reachable(modules, lambda m: [s for i in m.instructions for s in i.module_inputs]))


def dead_code_elimination(module: Module) -> None:
    """Remove every instruction that no kept instruction depends on."""
    if not module.instructions:
        return
    live: set[int] = set()
    visited_modules: set[int] = set()
    stack: list[Instruction] = [module.instructions[-1]]
    stack += [i for i in module.instructions if i.is_param()]
    while stack:
        ins = stack.pop()
        if id(ins) in live:
            continue
        live.add(id(ins))
        stack.extend(ins.inputs)
        if not ins.module_inputs:
            continue
        for sub in _nested(ins.module_inputs):
            if id(sub) in visited_modules:
                continue
            visited_modules.add(id(sub))
            for inner in sub.instructions:
                stack.extend(i for i in inner.inputs if i.module is module)
    dead = {i for i in module.instructions if id(i) not in live}
    if not dead:
        return
    members = {id(i) for i in module.instructions}
    for ins in dead:
        # modules still called by a live instruction (a sibling output of the same node) stay
        group = [m for m in _nested(ins.module_inputs) if id(m) not in visited_modules]
        if any(id(x) in members for m in group for inner in m.instructions for x in inner.inputs):
            for m in group:
                for inner in m.instructions:
                    for x in inner.inputs:
                        x.outputs = [u for u in x.outputs if u is not inner]
                m.instructions = []
    module.remove_instructions(dead)
