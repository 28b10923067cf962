"""fuse_pointwise: merge chains of element-wise instructions into `pointwise` sub-modules.

An element-wise instruction joins the group of its users when the target's fusion policy agrees
(`passes/fusion_policy.py`; by default: its users are all element-wise, all in that one group
and of its lens), so every group has exactly one value leaving it (its last
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
from pygraphx.passes.fusion_policy import (
    FusionGroup,
    FusionPolicy,
    FusionSite,
    FusionTrace,
)

if TYPE_CHECKING:
    from pygraphx.ir.program import Program


def is_pointwise(ins: Instruction) -> bool:
    return isinstance(ins.op, Pointwise)


def _groups(module: Module, policy: FusionPolicy, trace: FusionTrace) -> list[list[Instruction]]:
    """Assign groups walking backwards: an element-wise instruction is offered to the group of
    its first user and joins it when the policy agrees (by default: all its users are in that
    group and have its lens); otherwise it starts a group. So every member but the last has all
    its users inside the group, and one value leaves it."""
    group_of: dict[int, FusionGroup] = {}
    returned = {id(i) for i in module.get_returns()}
    order: list[FusionGroup] = []
    for ins in reversed(module.instructions):
        if not is_pointwise(ins):
            continue
        first = group_of.get(id(ins.outputs[0])) if ins.outputs else None
        group = first if first is not None else FusionGroup("pointwise", module, returned)
        reason = policy.can_fuse(group, ins)
        if reason is not None:
            if first is not None:
                trace.refused(first, ins, reason)
            group = FusionGroup("pointwise", module, returned)
            order.append(group)
        elif first is None:
            order.append(group)
        group.add(ins)
        group_of[id(ins)] = group
    # module order, so each group is in order too; groups numbered by their first member
    position = {id(ins): k for k, ins in enumerate(module.instructions)}
    groups = [sorted(g.members, key=lambda i: position[id(i)]) for g in order]
    return sorted(groups, key=lambda g: position[id(g[0])])


def fuse_pointwise(module: Module, program: Program, policy: FusionPolicy | None = None) -> None:
    """Replace every group of element-wise instructions by one `pointwise` instruction."""
    if module.parent is not None:
        return
    site = FusionSite("fuse_pointwise", "pointwise", module, program, policy)
    for group in _groups(module, site.policy, site.trace):
        members = {id(i) for i in group}
        external: list[Instruction] = []
        for ins in group:
            for i in ins.inputs:
                if id(i) not in members and all(i is not e for e in external):
                    external.append(i)
        body = site.new_body()
        mapping: dict[int, Instruction] = {}
        for k, e in enumerate(external):
            mapping[id(e)] = body.add_parameter(f"x{k}", e.shape)
        for ins in group:
            mapping[id(ins)] = body.add_instruction(ins.op, [mapping[id(i)] for i in ins.inputs])
        body.add_return([mapping[id(group[-1])]])
        site.replace(group, PointwiseModule(), external, body)
