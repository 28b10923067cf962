"""fuse_reduce: merge a reduction with the element-wise work around it into one sub-module.

After fuse_pointwise, each reduction-like instruction (softmax, logsoftmax, reduce_*) seeds a
group that grows towards its producers (prologue) and its users (epilogue) as far as the
target's fusion policy allows (`passes/fusion_policy.py`). With `DefaultFusion` (the CPU) a
reduction takes in only the single-use `pointwise` groups that feed it: attention's scale,
mask-add and softmax become one step. With `RowFusion` (the GPU) a whole layer norm or softmax
row becomes one group. Each group becomes a module `main:fused_reduceN`, called by one
`fused_reduce(...)` instruction; the body keeps the original instructions, so ref evaluates it
unchanged.

Whatever the policy says, the pass keeps two things true: a group never depends on itself
through an instruction outside it (`cycle`), and exactly one value leaves it (the group is cut
back to the last state that had one exit: `multiple_outputs`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops.fused import FusedReduce
from pygraphx.passes.fusion_policy import (
    REDUCE_LIKE,
    FusionGroup,
    FusionPolicy,
    FusionSite,
    FusionTrace,
    Reason,
)

if TYPE_CHECKING:
    from pygraphx.ir.program import Program

__all__ = ["REDUCE_LIKE", "fuse_reduce"]


def fuse_reduce(module: Module, program: Program, policy: FusionPolicy | None = None) -> None:
    """Grow a group around each reduction (see the module docstring) and fuse it."""
    if module.parent is not None:
        return
    site = FusionSite("fuse_reduce", "fused_reduce", module, program, policy)
    policy, trace = site.policy, site.trace
    returned = {id(i) for i in module.get_returns()}
    position = {id(ins): k for k, ins in enumerate(module.instructions)}
    fused_away: set[int] = set()
    for ins in list(module.instructions):
        if ins.op.name not in REDUCE_LIKE or id(ins) in fused_away:
            continue
        group = FusionGroup("reduce", module, returned)
        reason = policy.can_start(ins)
        if reason is not None:
            trace.refused(group, ins, reason)
            continue
        group.add(ins)
        _grow(group, policy, trace, position)
        members = sorted(group.members, key=lambda i: position[id(i)])
        if len(members) < 2 or _exits(group) != [members[-1]]:
            continue
        body = site.new_body()
        external = _build_body(body, members)
        fused = site.replace(members, FusedReduce(), external, body)
        position[id(fused)] = position[id(members[-1])]
        for m in members:
            fused_away.add(id(m))
            if m.op.name == "pointwise":
                program.remove_module(m.module_inputs[0].name)


def _neighbours(group: FusionGroup) -> list[Instruction]:
    """Producers and users of the members that are not members, in a stable order."""
    seen: set[int] = set()
    out: list[Instruction] = []
    for m in group.members:
        for x in [*m.inputs, *m.outputs]:
            if x in group or id(x) in seen or x.is_param() or x.is_literal() or x.is_return():
                continue
            seen.add(id(x))
            out.append(x)
    return out


def _grow(
    group: FusionGroup, policy: FusionPolicy, trace: FusionTrace, position: dict[int, int]
) -> None:
    """Offer neighbours to the policy until nothing more joins; a candidate refused once is
    offered again after the group grows (its users may have joined since)."""
    snapshot = list(group.members)
    refused: dict[int, tuple[Instruction, Reason]] = {}
    changed = True
    while changed:
        changed = False
        for cand in _neighbours(group):
            reason = policy.can_fuse(group, cand)
            if reason is None:
                group.add(cand)
                if _makes_cycle(group, position):
                    group.discard(cand)
                    reason = Reason("cycle", "the group would depend on itself through it")
            if reason is not None:
                refused[id(cand)] = (cand, reason)
                continue
            refused.pop(id(cand), None)
            changed = True
            if len(_exits(group)) == 1:
                snapshot = list(group.members)
    for m in [m for m in group.members if all(m is not s for s in snapshot)]:
        group.discard(m)
        refused[id(m)] = (m, Reason("multiple_outputs", "more than one value would leave it"))
    for cand, reason in refused.values():
        trace.refused(group, cand, reason)


def _exits(group: FusionGroup) -> list[Instruction]:
    """Members whose value is used outside the group or returned."""
    return [
        m
        for m in group.members
        if id(m) in group.returned or any(u not in group for u in m.outputs)
    ]


def _makes_cycle(group: FusionGroup, position: dict[int, int]) -> bool:
    """True when a member uses a value computed outside the group from one of its members."""
    last = max(position[id(m)] for m in group.members)
    seen: set[int] = set()
    stack = [u for m in group.members for u in m.outputs if u not in group]
    while stack:
        x = stack.pop()
        if id(x) in seen or position.get(id(x), last + 1) > last:
            continue
        seen.add(id(x))
        stack.extend(u for u in x.outputs if u not in group)
    return any(id(i) in seen for m in group.members for i in m.inputs)


def _build_body(body: Module, members: list[Instruction]) -> list[Instruction]:
    """Fill `body` with the members' code in module order (a `pointwise` member's sub-module is
    inlined); returns the outer inputs, one parameter each."""
    external: list[Instruction] = []
    params: dict[int, Instruction] = {}
    values: dict[int, Instruction] = {}

    def value(x: Instruction) -> Instruction:
        if id(x) in values:
            return values[id(x)]
        if id(x) not in params:
            params[id(x)] = body.add_parameter(f"x{len(external)}", x.shape)
            external.append(x)
        return params[id(x)]

    for m in members:
        if m.op.name != "pointwise":
            values[id(m)] = body.add_instruction(m.op, [value(i) for i in m.inputs])
            continue
        sub = m.module_inputs[0]
        inner: dict[int, Instruction] = {}
        for k, sp in enumerate(sub.get_parameters()):
            inner[id(sp)] = value(m.inputs[k])
        for si in sub.instructions:
            if si.is_param():
                continue
            if si.is_return():
                values[id(m)] = inner[id(si.inputs[0])]
                break
            inner[id(si)] = body.add_instruction(si.op, [inner[id(i)] for i in si.inputs])
    body.add_return([values[id(members[-1])]])
    return external
