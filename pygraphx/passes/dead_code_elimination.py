"""dead_code_elimination: remove instructions whose values nothing uses.

Walks the module backwards from its `@return` (or its last instruction); parameters are kept so
the program's signature never changes.
"""

from __future__ import annotations

from pygraphx.ir.module import Module


def dead_code_elimination(module: Module) -> None:
    """Remove every instruction that no kept instruction depends on."""
    if not module.instructions:
        return
    live: set[int] = set()
    stack = [module.instructions[-1]]
    stack += [i for i in module.instructions if i.is_param()]
    while stack:
        ins = stack.pop()
        if id(ins) in live:
            continue
        live.add(id(ins))
        stack.extend(ins.inputs)
    dead = {i for i in module.instructions if id(i) not in live}
    if dead:
        module.remove_instructions(dead)
