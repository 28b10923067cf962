"""fuse_pointwise: merge chains of element-wise instructions into `pointwise` sub-modules.

A pointwise instruction joins the group of an element-wise input when that input has no other
user and the same lens, so every group has exactly one value leaving it (its last instruction).
Each group becomes a sub-module `main:pointwiseN` (parameters `x0, x1, ...` for the values
entering it) and one `pointwise(...)` instruction in the parent, as in MIGraphX. Every target can
run the group: ref evaluates the body, the code generators compile it to one kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops.fused import PointwiseModule
from pygraphx.ops.pointwise import Pointwise

if TYPE_CHECKING:
    from pygraphx.ir.program import Program


def is_pointwise(ins: Instruction) -> bool:
    return isinstance(ins.op, Pointwise)


def _groups(module: Module) -> list[list[Instruction]]:
    """Union-find over element-wise instructions joined to single-use element-wise inputs."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    returned = {id(i) for i in module.get_returns()}
    for ins in module.instructions:
        if not is_pointwise(ins):
            continue
        parent[id(ins)] = id(ins)
        for i in ins.inputs:
            if (
                id(i) in parent
                and id(i) not in returned
                and len(i.outputs) == 1
                and i.shape.lens() == ins.shape.lens()
            ):
                parent[find(id(i))] = find(id(ins))
    groups: dict[int, list[Instruction]] = {}
    for ins in module.instructions:  # module order, so each group is in order too
        if id(ins) in parent:
            groups.setdefault(find(id(ins)), []).append(ins)
    return list(groups.values())


def fuse_pointwise(module: Module, program: Program) -> None:
    """Replace every group of element-wise instructions by one `pointwise` instruction."""
    if module.parent is not None:
        return
    counter = sum(1 for name in program.modules if name.startswith(f"{module.name}:pointwise"))
    for group in _groups(module):
        members = {id(i) for i in group}
        external: list[Instruction] = []
        for ins in group:
            for i in ins.inputs:
                if id(i) not in members and all(i is not e for e in external):
                    external.append(i)
        name = f"{module.name}:pointwise{counter}"
        counter += 1
        body = program.create_module(name, parent=module)
        mapping: dict[int, Instruction] = {}
        for k, e in enumerate(external):
            mapping[id(e)] = body.add_parameter(f"x{k}", e.shape)
        for ins in group:
            mapping[id(ins)] = body.add_instruction(ins.op, [mapping[id(i)] for i in ins.inputs])
        body.add_return([mapping[id(group[-1])]])
        last = group[-1]
        fused = module.insert_instruction(last, PointwiseModule(), external, [body])
        module.replace_instruction(last, fused)
        module.remove_instructions(set(group))
