"""The state of lowering one module to torch: value slots, the arena, scratch, and the steps.

Every IR value gets an index into `env`, a plain Python list the steps read and write. A value
known when the program is prepared (a literal, an arena slot, a view of either) sits in `env`
for good and costs nothing per run; a value that changes every run (a parameter, a tensor a torch
call allocates, a view of those) is stored by the step that makes it. Steps are closures bound
to their indices and tensors, so running the program is a loop over them.

Intermediates live in one uint8 arena tensor carved at `memory_plan`'s offsets; scratch buffers
of fused groups come from a small pool shared by all steps (steps run one at a time). On the
host the arena is reserved, not filled, at prepare: its pages are touched (and count) only when a
run writes them, so compiling a program with huge intermediates costs no memory; an arena that
cannot even be reserved is an `ArenaError` naming its size and largest buffers. Weights that are
views of a mapped model file have their pages given back as each step that read them is emitted
(`release_weight_pages`), so packing them does not hold the file's pages beside the copies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.mapped import release_range
from pygraphx.ir.printer import instruction_names
from pygraphx.ir.program import ProgramError
from pygraphx.ir.shape import Shape
from pygraphx.passes.memory_coloring import root_of
from pygraphx.targets.torch_lowering.dtypes import torch_dtype

if TYPE_CHECKING:
    from pygraphx.ir.module import Module
    from pygraphx.passes.memory_coloring import MemoryPlan

#: a function lowering a deferred producer together with its user: (ctx, user) -> handled
Fuser = Callable[["LoweringContext", Instruction], bool]

#: memory formats a value's tensor may have
STANDARD, CHANNELS_LAST = "std", "cl"


@dataclass
class Step:
    """One run-time step: `fn()` computes the value of `instructions[-1]` into `env[out]`.

    `instructions` are the IR instructions the step covers (more than one when a lowering fused
    a producer into its user); `unfused` are the steps to run instead when profiling;
    `fallback` marks a step that runs the operator's numpy code (`fallback.py`).
    """

    fn: Callable[[], None]
    instructions: list[Instruction]
    out: int
    unfused: list[Step] | None = None
    fallback: bool = False


class LoweringError(RuntimeError):
    """An instruction could not be lowered; the message names it."""


class ArenaError(LoweringError, ProgramError, MemoryError):
    """The arena of intermediates could not be allocated; the message gives its size and the
    instructions whose buffers are largest (a `ProgramError`: this program cannot be compiled
    for this target with this memory)."""


class ScratchPool:
    """Reusable byte buffers for temporaries of fused steps, grown as steps ask for more.

    Buffer `k` is shared by every step that needs a k-th temporary; the typed views handed out
    follow the buffer when it grows (torch views share the storage object, which `resize_`
    reallocates in place).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers: list[torch.Tensor] = []

    def get(self, k: int, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Scratch `k` viewed with `like`'s lens and strides (which must be dense)."""
        dtype = dtype or like.dtype
        while len(self.buffers) <= k:
            self.buffers.append(torch.empty(0, dtype=torch.uint8, device=self.device))
        buf = self.buffers[k]
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = max(like.numel(), 1) * itemsize
        if buf.numel() < nbytes:
            buf.resize_(nbytes)
        flat = buf[:nbytes].view(dtype)
        return flat.as_strided(like.shape, like.stride())


#: no machine addresses more bytes than this (2**63 - 1: torch's sizes are signed 64-bit)
MAX_ARENA_BYTES = 2**63 - 1


def allocate_arena(plan: MemoryPlan, device: torch.device) -> torch.Tensor:
    """The arena for `plan`: reserved untouched on the host (`torch.empty`: no page is written
    until a run writes it), zeroed on a device; `ArenaError` when it cannot be had."""
    nbytes = max(plan.arena_bytes, 1)
    if nbytes > MAX_ARENA_BYTES:  # beyond any address space (torch would fail to unpack it)
        raise ArenaError(_arena_message(plan, device, OverflowError(f"{nbytes} bytes")))
    try:
        if device.type == "cpu":
            return torch.empty(nbytes, dtype=torch.uint8, device=device)
        return torch.zeros(nbytes, dtype=torch.uint8, device=device)
    except (RuntimeError, MemoryError) as exc:  # torch's allocator: "can't allocate memory"
        raise ArenaError(_arena_message(plan, device, exc)) from exc


def _arena_message(plan: MemoryPlan, device: torch.device, exc: BaseException) -> str:
    largest = sorted(plan.buffers, key=lambda b: b.size, reverse=True)[:3]
    named = []
    for b in largest:
        label = instruction_names(b.ins.module).get(id(b.ins), "?") if b.ins.module else "?"
        named.append(f"{label} {b.ins.op.name} {b.ins.shape} ({_gb(b.size)})")
    return (
        f"cannot allocate the {plan.arena_bytes:,}-byte ({_gb(plan.arena_bytes)}) arena for the "
        f"program's intermediates on {device}; largest buffers: {', '.join(named)}. "
        f"Smaller input dimensions (or a smaller dynamic maximum) shrink it. ({exc})"
    )


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB"


@dataclass
class LoweringContext:
    """What every lowering function sees (see the module docstring)."""

    device: torch.device
    options: dict[str, Any]
    plan: MemoryPlan | None
    env: list[Any] = field(default_factory=list)
    index: dict[int, int] = field(default_factory=dict)
    static: list[bool] = field(default_factory=list)
    const: list[bool] = field(default_factory=list)
    layout: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    fallbacks: Counter = field(default_factory=Counter)
    arena: torch.Tensor | None = None
    offsets: dict[int, int] = field(default_factory=dict)
    shared: dict[int, int] = field(default_factory=dict)
    """rn11: id(instruction) -> offset of the slots shared with an input, not yet claimed."""
    scratch: ScratchPool | None = None
    module: Module | None = None
    """The module being lowered."""
    position: dict[int, int] = field(default_factory=dict)
    """id(instruction) -> its index in `module.instructions` (for names and order checks)."""
    fusers: dict[int, Fuser] = field(default_factory=dict)
    """id(user) -> the function that lowers the user together with its deferred producer."""
    producers: dict[int, Instruction] = field(default_factory=dict)
    """id(user) -> the producer deferred into it (`registry.defer`)."""
    deferred: set[int] = field(default_factory=set)
    """ids of producers deferred into their user: they emit no step of their own."""
    packed_weights: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    """(library, id(weight), geometry...) -> a weight reordered once for oneDNN or MKL."""
    fresh: set[int] = field(default_factory=set)
    """env indices whose step stores a tensor it allocated itself (outputs need no copy)."""
    sources: list[str] = field(default_factory=list)
    """The generated source of every fused pointwise step (for tests and tracing)."""
    host_reads: list[str] = field(default_factory=list)
    """Ops whose steps read device values on the host every run (they rule out graph capture)."""
    bounded: set[int] = field(default_factory=set)
    """ids of instructions whose lens are only bounded by their shape (`fallback.py`)."""
    cache: dict[Any, Any] = field(default_factory=dict)
    """Entries private to one target (targets/gpu: attention matching, Triton groups)."""

    def __post_init__(self) -> None:
        if self.scratch is None:
            self.scratch = ScratchPool(self.device)
        if self.plan is not None:
            self.offsets = {id(b.ins): b.offset for b in self.plan.buffers}
            # rn11: a buffer the plan gave an input's memory (`shared_slot`) is a slot only
            # for the lowering that claims it (`claim_shared`); others write a new tensor
            shared = [id(b.ins) for b in self.plan.buffers if b.same_as is not None]
            self.shared = {i: self.offsets.pop(i) for i in shared}
            if self.arena is None:
                self.arena = allocate_arena(self.plan, self.device)

    # --- value slots ----------------------------------------------------------------------
    def new_slot(
        self,
        value: Any = None,
        *,
        static: bool = False,
        layout: str = STANDARD,
        const: bool = False,
    ) -> int:
        self.env.append(value)
        self.static.append(static)
        self.const.append(const)
        self.layout.append(layout)
        return len(self.env) - 1

    def arg(self, ins: Instruction, k: int) -> int:
        """The env index of input `k` of `ins`."""
        return self.index[id(ins.inputs[k])]

    def args(self, ins: Instruction) -> list[int]:
        return [self.index[id(i)] for i in ins.inputs]

    def value(self, idx: int) -> torch.Tensor | None:
        """The tensor object at `idx` when it is fixed at prepare time (an arena slot, a
        constant, a view of either; its contents may change every run), else None."""
        return self.env[idx] if self.static[idx] else None

    def constant(self, idx: int) -> torch.Tensor | None:
        """The tensor at `idx` when its *values* are known at prepare time (a literal or a view
        of one), else None."""
        return self.env[idx] if self.const[idx] else None

    def bind_static(
        self, ins: Instruction, tensor: torch.Tensor, layout: str = STANDARD, const: bool = False
    ) -> int:
        idx = self.new_slot(tensor, static=True, layout=layout, const=const)
        self.index[id(ins)] = idx
        return idx

    def bind_dynamic(self, ins: Instruction, layout: str = STANDARD) -> int:
        idx = self.new_slot(None, layout=layout)
        self.index[id(ins)] = idx
        return idx

    def replace_literal(self, ins: Instruction, k: int, value: torch.Tensor) -> None:
        """Put `value` (input `k` of `ins`, a literal, in the layout `ins` wants) in the
        literal's slot when `ins` is its only user, so the device holds the weight once, not the
        upload beside its relaid copy."""
        literal = ins.inputs[k]
        idx = self.arg(ins, k)
        if value is self.env[idx] or not literal.is_literal():
            return
        if all(u is ins for u in literal.outputs):
            self.env[idx] = value

    def mark_fresh(self, idx: int) -> None:
        """The step at `idx` stores a tensor it allocated itself (outputs need no copy)."""
        self.fresh.add(idx)

    def run_owned(self, ins: Instruction) -> bool:
        """Whether `ins`'s value is a tensor its step allocates each run (`fresh`), not an arena
        slot, a parameter or a constant: the one kind a later step may write over once its
        other readers are done (the in-place sums and norms ask it)."""
        idx = self.index.get(id(ins))
        if idx is None or idx not in self.fresh:
            return False
        return not self.static[idx] and not self.const[idx]

    def alias(self, ins: Instruction, idx: int) -> int:
        self.index[id(ins)] = idx
        return idx

    def claim_shared(self, ins: Instruction, x: Instruction) -> bool:
        """rn11: take `ins`'s slot where the plan gave it the memory of input `x`'s buffer
        (the lowering then writes its result over `x`), else False."""
        at = self.shared.get(id(ins))
        if at is None or at != self.offsets.get(id(root_of(x))):
            return False
        self.offsets[id(ins)] = self.shared.pop(id(ins))
        return True

    def has_slot(self, ins: Instruction) -> bool:
        return id(ins) in self.offsets

    def apart(self, x: Instruction, user: Instruction) -> bool:
        """Whether `user`'s arena slot shares no byte with the buffer `x` lives in: the memory
        plan may give a result the memory of an input that died before it, which a fused step
        reading `x` while it writes `user`'s slot must not be given."""
        root = root_of(x)
        if not (self.has_slot(root) and self.has_slot(user)):  # a parameter, a literal, ...
            return True
        a, b = self.offsets[id(root)], self.offsets[id(user)]
        return a + root.shape.bytes() <= b or b + user.shape.bytes() <= a

    def slot_tensor(self, ins: Instruction, layout: str = STANDARD) -> torch.Tensor:
        """A typed view of `ins`'s place in the arena (standard or channels-last strides)."""
        shape = ins.shape
        return self.arena_view(self.offsets[id(ins)], shape, layout)

    def arena_view(self, offset: int, shape: Shape, layout: str = STANDARD) -> torch.Tensor:
        dtype = torch_dtype(shape.dtype())
        lens = shape.lens()
        n = shape.elements()
        itemsize = shape.type_size()
        flat = self.arena[offset : offset + n * itemsize].view(dtype)
        if layout == CHANNELS_LAST and len(lens) == 4:
            nn, c, h, w = lens
            return flat.view(nn, h, w, c).permute(0, 3, 1, 2)
        return flat.view(lens)

    def output(self, ins: Instruction, layout: str = STANDARD) -> tuple[int, torch.Tensor | None]:
        """The env index `ins`'s step writes, and the tensor to write into (its arena slot), or
        None when it has no slot (the step then stores a new tensor at the index)."""
        if self.has_slot(ins):
            t = self.slot_tensor(ins, layout)
            return self.bind_static(ins, t, layout), t
        return self.bind_dynamic(ins, layout), None

    # --- steps ----------------------------------------------------------------------------
    def emit(
        self,
        fn: Callable[[], None],
        instructions: Instruction | list[Instruction],
        out: int,
        unfused: list[Step] | None = None,
    ) -> Step:
        if isinstance(instructions, Instruction):
            instructions = [instructions]
        step = Step(fn, list(instructions), out, unfused)
        self.steps.append(step)
        self.release_weight_pages(step.instructions)
        return step

    def release_weight_pages(self, instructions: list[Instruction]) -> None:
        """Give back the pages of mapped model files that the fixed host inputs of
        `instructions` have read while being lowered (a packed copy made, a bias extracted):
        the process then never holds a weight twice while later weights are packed. A step
        that reads such an input as it is faults its pages back in (`ir/mapped.py`)."""
        for ins in instructions:
            for i in ins.inputs:
                idx = self.index.get(id(i))
                t = self.env[idx] if idx is not None and self.const[idx] else None
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    storage = t.untyped_storage()
                    release_range(storage.data_ptr(), storage.nbytes())
