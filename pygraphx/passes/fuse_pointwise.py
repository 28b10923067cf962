"""fuse_pointwise: merge chains of element-wise instructions into `pointwise` sub-modules.

An element-wise instruction joins the group of its users when they are all element-wise, all
in that one group and of its lens, so every group has exactly one value leaving it (its last
instruction) and values used several times inside a region (GELU's x) stay inside.
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
    """Assign groups walking backwards: an element-wise instruction joins the group of its users
    when all of them are in one group and have its lens; otherwise it starts a group. So every
    member but the last has all its users inside the group, and one value leaves it."""
    group_of: dict[int, int] = {}
    returned = {id(i) for i in module.get_returns()}
    next_group = 0
    for ins in reversed(module.instructions):
        if not is_pointwise(ins):
            continue
        users = {group_of.get(id(u), -1) for u in ins.outputs}
        same_lens = all(u.shape.lens() == ins.shape.lens() for u in ins.outputs)
        if len(users) == 1 and -1 not in users and same_lens and id(ins) not in returned:
            group_of[id(ins)] = users.pop()
        else:
            group_of[id(ins)] = next_group
            next_group += 1
    groups: dict[int, list[Instruction]] = {}
    for ins in module.instructions:  # module order, so each group is in order too
        if id(ins) in group_of:
            groups.setdefault(group_of[id(ins)], []).append(ins)
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
