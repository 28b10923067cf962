"""memory_coloring: place every intermediate buffer of a module in one scratch arena.

1. Buffers: each instruction that makes a new value (not a parameter, literal, or view of its
   input) owns a buffer; a view's uses count as uses of the buffer it aliases.
2. Liveness: a buffer lives from the instruction that writes it to its last use (returned
   values live to the end). A target that runs a producer inside its user's step (a
   convolution fused with its epilogue, writing the user's buffer while it reads its own
   inputs) says so through `fused_reads`: the producer's inputs then live to the user.
   A target whose step writes its result over an input that dies there (oneDNN's in-place
   sum of a residual) names that input through `shared_slot`: the two then share one buffer.
3. Interference: two buffers interfere when their live ranges overlap.
4. Colouring: buffers are placed largest first, each at the lowest aligned offset that overlaps
   no interfering buffer already placed (a first-fit colouring of the interference graph where
   colours are address ranges).

The plan is stored on the module (`module.memory_plan`); `check_plan` proves no two buffers that
live at the same time overlap (run automatically with `PGX_DEBUG_MEMORY_COLORING=1`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from pygraphx.ir import registry
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module

ALIGNMENT = 64


@dataclass
class Buffer:
    ins: Instruction
    size: int
    start: int
    end: int
    offset: int = -1
    same_as: Buffer | None = None  # the buffer whose memory this one takes over (`shared_slot`)

    def root(self) -> Buffer:
        """The buffer whose place this one has (itself unless it shares one)."""
        b = self
        while b.same_as is not None:
            b = b.same_as
        return b


@dataclass
class MemoryPlan:
    """Offsets of every intermediate buffer in one arena of `arena_bytes`."""

    alignment: int
    buffers: list[Buffer] = field(default_factory=list)
    arena_bytes: int = 0

    def offset_of(self, ins: Instruction) -> int:
        for b in self.buffers:
            if b.ins is ins:
                return b.offset
        raise KeyError(f"{ins.op.name} has no buffer in the plan")

    @property
    def naive_bytes(self) -> int:
        """What giving every intermediate its own buffer would take."""
        return sum(b.size for b in self.buffers)

    @property
    def lower_bound(self) -> int:
        """The largest total of simultaneously live bytes (no plan can use less)."""
        events: list[tuple[int, int]] = []
        for b in self.buffers:
            if b.same_as is not None:  # counted in the buffer it shares
                continue
            events.append((b.start, b.size))
            events.append((b.end + 1, -b.size))
        live = peak = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
            live += delta
            peak = max(peak, live)
        return peak


def _aligned(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def root_of(ins: Instruction) -> Instruction:
    """The instruction whose buffer `ins` lives in (itself unless it is a view)."""
    while True:
        alias = ins.op.output_alias(len(ins.inputs))
        if alias < 0 or ins.is_param() or ins.is_literal():
            return ins
        ins = ins.inputs[alias]


#: instruction -> the later instruction whose step reads its inputs (or None): see plan_memory
FusedReads = Callable[[Instruction], "Instruction | None"]
#: instruction -> the input whose buffer its result may take over (or None): see plan_memory
SharedSlot = Callable[[Instruction], "Instruction | None"]


def live_buffers(
    module: Module,
    alignment: int = ALIGNMENT,
    unplanned: Callable[[Instruction], bool] | None = None,
    fused_reads: FusedReads | None = None,
    shared_slot: SharedSlot | None = None,
) -> list[Buffer]:
    """Steps 1 and 2: the buffers of `module` in its current order, with their live ranges
    (not yet placed). `unplanned`, `fused_reads` and `shared_slot` as in `plan_memory`."""
    buffers: dict[int, Buffer] = {}
    end_of_module = len(module.instructions)
    for k, ins in enumerate(module.instructions):
        if ins.is_param() or ins.is_literal() or ins.is_return():
            continue
        if unplanned is not None and unplanned(ins):
            continue
        if ins.op.output_alias(len(ins.inputs)) >= 0:
            continue
        buffers[id(ins)] = Buffer(ins, _aligned(max(ins.shape.bytes(), 1), alignment), k, k)
    for k, ins in enumerate(module.instructions):
        for i in ins.inputs:
            b = buffers.get(id(root_of(i)))
            if b is not None:
                b.end = max(b.end, end_of_module if ins.is_return() else k)
    if fused_reads is not None:
        _extend_fused_reads(module, buffers, fused_reads)
    if shared_slot is not None:
        _share_slots(module, buffers, shared_slot)
    return list(buffers.values())


def _share_slots(module: Module, buffers: dict[int, Buffer], shared_slot: SharedSlot) -> None:
    """Give each instruction that `shared_slot` names an input for the buffer of that input,
    where the input's buffer is as large and nothing reads it after the instruction (its live
    range ends there): the shared buffer then lives through both ranges."""
    position = {id(ins): k for k, ins in enumerate(module.instructions)}
    for ins in module.instructions:
        b = buffers.get(id(ins))
        x = shared_slot(ins) if b is not None else None
        a = None if x is None else buffers.get(id(root_of(x)))
        if a is None or a is b or a.size != b.size or a.end != position[id(ins)]:
            continue
        b.same_as = a
        root = a.root()
        root.end = max(root.end, b.end)


def _extend_fused_reads(
    module: Module, buffers: dict[int, Buffer], fused_reads: FusedReads
) -> None:
    """Keep the inputs of every producer that `fused_reads` runs inside a later user's step
    live to that user: the step reads them while it writes the user's buffer."""
    position = {id(ins): k for k, ins in enumerate(module.instructions)}
    for ins in module.instructions:
        user = fused_reads(ins)
        if user is None or id(user) not in position:
            continue
        for i in ins.inputs:
            b = buffers.get(id(root_of(i)))
            if b is not None:
                b.end = max(b.end, position[id(user)])


def live_peak(module: Module) -> int:
    """The largest total of simultaneously live bytes of `module` in its current order (what
    `plan_memory(module).lower_bound` gives, without placing the buffers)."""
    return MemoryPlan(ALIGNMENT, live_buffers(module)).lower_bound


def plan_memory(
    module: Module,
    alignment: int = ALIGNMENT,
    unplanned: Callable[[Instruction], bool] | None = None,
    fused_reads: FusedReads | None = None,
    shared_slot: SharedSlot | None = None,
) -> MemoryPlan:
    """Liveness, interference and first-fit placement for `module` in its current order.

    `unplanned(ins)`: True for instructions whose results the caller places itself (a target
    whose library calls return new tensors, e.g. the gpu target's convolutions and the
    epilogues it runs in place on them): they get no buffer, so the arena reserves no room
    nobody writes.

    `fused_reads(ins)`: the later instruction whose step computes `ins` too (the cpu target's
    convolutions with `conv_output="arena"` run inside their epilogue's step and write its
    buffer), or None: `ins`'s inputs then stay live to that instruction, so its buffer never
    shares memory with them (without it, an input dead after `ins` may give its memory to
    the user).

    `shared_slot(ins)`: an input of `ins` whose buffer `ins`'s result may take over (the cpu
    target's convolution writing its sum over the residual it adds), or None; it is taken
    where that input's buffer is as large and dies at `ins` (both then have one offset)."""
    buffers = live_buffers(module, alignment, unplanned, fused_reads, shared_slot)
    plan = MemoryPlan(alignment, buffers)
    placed: list[Buffer] = []
    for b in sorted(plan.buffers, key=lambda b: (-b.size, b.start)):
        if b.same_as is not None:
            continue
        busy = sorted(
            (p.offset, p.offset + p.size) for p in placed if p.start <= b.end and b.start <= p.end
        )
        offset = 0
        for lo, hi in busy:
            if offset + b.size <= lo:
                break
            offset = max(offset, hi)
        b.offset = offset
        placed.append(b)
    for b in plan.buffers:
        if b.same_as is not None:
            b.offset = b.root().offset
    plan.arena_bytes = max((b.offset + b.size for b in plan.buffers), default=0)
    return plan


def check_plan(plan: MemoryPlan) -> None:
    """Raise if two buffers that are live at the same time overlap in the arena."""
    bs = sorted(plan.buffers, key=lambda b: b.offset)
    for i, a in enumerate(bs):
        for b in bs[i + 1 :]:
            if b.offset >= a.offset + a.size:
                break
            if a.root() is b.root():  # one buffer shared (`shared_slot`)
                continue
            if a.start <= b.end and b.start <= a.end:
                raise AssertionError(
                    f"memory_coloring: {a.ins.op} [{a.offset}, {a.offset + a.size}) and "
                    f"{b.ins.op} [{b.offset}, {b.offset + b.size}) overlap while both are live"
                )


def memory_coloring(module: Module) -> None:
    """Compute and attach `module.memory_plan`."""
    plan = plan_memory(module)
    if os.environ.get("PGX_DEBUG_MEMORY_COLORING", "") not in ("", "0"):
        check_plan(plan)
    module.memory_plan = plan  # type: ignore[attr-defined]


# `Program.get_memory_usage` (in the IR, below this layer) plans through the registry
registry.register_memory_planner(plan_memory)
