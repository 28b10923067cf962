"""Fusion policies: what a target lets `fuse_pointwise`/`fuse_reduce` group, and why not.

The two fusion passes walk the program and propose candidates; a `FusionPolicy` answers
`can_fuse(group, candidate)` with `None` (yes) or a `Reason` (a short code and a sentence). A
target picks its policy (`Target.fusion_policy()`), so a CPU and a GPU get different groups from
the same passes:

* `DefaultFusion` is the CPU's behaviour: chains of element-wise instructions become `pointwise`
  groups, and a reduction absorbs the `pointwise` groups that feed it and nothing else;
* `RowFusion` is for code generators that compute a whole row in one kernel (Triton on the GPU):
  a reduction over trailing axes grows into one `fused_reduce` group with its element-wise
  prologue, the broadcasts of its result back over the row, further reductions of the same row
  and the element-wise epilogue, so a softmax or a layer norm is one group.

`PGX_TRACE_FUSION=1` prints every refusal (instruction, candidate, reason) and every group the
passes form, on stderr (`FusionTrace`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pygraphx.ir.instruction import Instruction, merge_sources
from pygraphx.ir.module import Module
from pygraphx.ir.op import Op
from pygraphx.ir.printer import instruction_names
from pygraphx.ir.shape import FLOAT_TYPES
from pygraphx.ops.pointwise import Pointwise

if TYPE_CHECKING:
    from pygraphx.ir.program import Program

REDUCE_LIKE = frozenset(
    ["softmax", "logsoftmax", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min",
     "reduce_prod"]
)  # fmt: skip

#: why a candidate stays out of a group; codes are stable (tests and traces use them)
REASON_CODES = frozenset(
    ["not_fusible", "multiple_users", "is_output", "shape_mismatch", "reduce_not_last_axis",
     "dtype_mismatch", "too_large", "target_refuses", "cycle", "multiple_outputs"]
)  # fmt: skip


@dataclass(frozen=True)
class Reason:
    """Why a candidate was not fused: a stable `code` (see REASON_CODES) and a `message`."""

    code: str
    message: str

    def __post_init__(self) -> None:
        if self.code not in REASON_CODES:
            raise ValueError(f"unknown fusion reason code {self.code!r}")

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class FusionGroup:
    """A group being formed in `module`: `kind` is "pointwise" or "reduce"; members in order of
    joining (the first member of a reduce group is the reduction it grew from)."""

    def __init__(self, kind: str, module: Module, returned: Collection[int]) -> None:
        self.kind = kind
        self.module = module
        self.returned = returned  # ids of the module's returned instructions
        self.members: list[Instruction] = []
        self._ids: set[int] = set()

    def add(self, ins: Instruction) -> None:
        self.members.append(ins)
        self._ids.add(id(ins))

    def discard(self, ins: Instruction) -> None:
        if id(ins) in self._ids:
            self._ids.remove(id(ins))
            self.members.remove(ins)

    def __contains__(self, ins: object) -> bool:
        return id(ins) in self._ids

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    @property
    def seed(self) -> Instruction | None:
        return self.members[0] if self.members else None


class FusionPolicy(Protocol):
    """What a target allows in one fused group."""

    name: str

    def can_fuse(self, group: FusionGroup, candidate: Instruction) -> Reason | None:
        """None when `candidate` may join `group`, else why not."""
        ...

    def can_start(self, reduction: Instruction) -> Reason | None:
        """None when `fuse_reduce` may grow a group from `reduction`, else why not."""
        ...


def _describe(ins: Instruction) -> str:
    return f"{ins.op.name} {list(ins.shape.lens())}"


def inner_op_names(ins: Instruction) -> list[str]:
    """The op names an instruction computes (a fused group's body, else its own op)."""
    if ins.op.name in ("pointwise", "fused_reduce") and ins.module_inputs:
        body = ins.module_inputs[0].instructions
        return [i.op.name for i in body if not (i.is_param() or i.is_return())]
    return [ins.op.name]


class DefaultFusion:
    """Today's CPU fusion. `max_group_size` (instructions of the group, None = no limit) and
    `refuse_ops` (op names the target cannot put in a generated group) are the target's knobs;
    the defaults change nothing."""

    name = "default"

    def __init__(self, max_group_size: int | None = None, refuse_ops: Collection[str] = ()) -> None:
        self.max_group_size = max_group_size
        self.refuse_ops = frozenset(refuse_ops)

    def can_start(self, reduction: Instruction) -> Reason | None:
        return None

    def can_fuse(self, group: FusionGroup, candidate: Instruction) -> Reason | None:
        common = self._common(group, candidate)
        if common is not None:
            return common
        if group.kind == "pointwise":
            return self._pointwise(group, candidate)
        return self._reduce(group, candidate)

    def _common(self, group: FusionGroup, candidate: Instruction) -> Reason | None:
        refused: list[str] = []
        if self.refuse_ops:  # the op may not share a group, whichever side it is on
            ops = {op for m in [candidate, *group] for op in inner_op_names(m)}
            refused = sorted(ops & self.refuse_ops)
        if refused and len(group) > 0:
            return Reason("target_refuses", f"{self.name} fusion cannot generate {refused}")
        if self.max_group_size is not None and len(group) >= self.max_group_size:
            return Reason("too_large", f"the group already has {len(group)} instructions")
        return None

    def _pointwise(self, group: FusionGroup, candidate: Instruction) -> Reason | None:
        if not isinstance(candidate.op, Pointwise):
            return Reason("not_fusible", f"{candidate.op.name} is not element-wise")
        if id(candidate) in group.returned:
            return Reason("is_output", "the value is returned from the module")
        outside = [u for u in candidate.outputs if u not in group]
        if outside:
            users = ", ".join(sorted({_describe(u) for u in outside}))
            return Reason("multiple_users", f"also used outside the group, by {users}")
        if any(u.shape.lens() != candidate.shape.lens() for u in candidate.outputs):
            return Reason("shape_mismatch", "a user has other lens (a broadcast or reduction)")
        return None

    def _reduce(self, group: FusionGroup, candidate: Instruction) -> Reason | None:
        seed = group.seed
        if seed is None or not any(i is candidate for i in seed.inputs):
            return Reason("not_fusible", "default fusion takes only what feeds the reduction")
        if candidate.op.name != "pointwise":
            return Reason("not_fusible", f"{candidate.op.name} is not a pointwise group")
        if id(candidate) in group.returned:
            return Reason("is_output", "the value is returned from the module")
        if len(candidate.outputs) != 1:
            return Reason("multiple_users", f"used {len(candidate.outputs)} times")
        return None


def trailing_axes(reduction: Instruction) -> tuple[int, ...] | None:
    """The reduced axes when they are the last axes of the input, else None."""
    rank = len(reduction.inputs[0].shape.lens())
    op = reduction.op
    raw = [op.axis] if hasattr(op, "axis") else list(getattr(op, "axes", ()))
    axes = sorted({a + rank if a < 0 else a for a in raw}) or list(range(rank))
    if axes != list(range(rank - len(axes), rank)):
        return None
    return tuple(axes)


def _row_shapes(reduction: Instruction) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(full row lens, reduced lens) of a reduction over trailing axes."""
    lens = tuple(reduction.inputs[0].shape.lens())
    k = len(trailing_axes(reduction) or ())
    return lens, lens[: len(lens) - k] + (1,) * k


class RowFusion(DefaultFusion):
    """Whole rows in one `fused_reduce` group, for targets that generate one kernel per row
    (see the module docstring). Element-wise grouping is the default's."""

    name = "row"

    def __init__(self, max_group_size: int | None = 64, refuse_ops: Collection[str] = ()) -> None:
        super().__init__(max_group_size, refuse_ops)

    def can_start(self, reduction: Instruction) -> Reason | None:
        if trailing_axes(reduction) is None:
            return Reason("reduce_not_last_axis", f"{reduction.op} does not reduce the last axes")
        return None

    def _reduce(self, group: FusionGroup, candidate: Instruction) -> Reason | None:
        seed = group.seed
        assert seed is not None
        shape = self._row_shape(group, seed, candidate)
        if shape is not None:
            return shape
        if any(u in group for u in candidate.outputs):  # a producer: must stay inside
            if id(candidate) in group.returned:
                return Reason("is_output", "the value is returned from the module")
            outside = sorted({_describe(u) for u in candidate.outputs if u not in group})
            if outside:
                return Reason("multiple_users", f"also used by {', '.join(outside)}")
        row_type = seed.inputs[0].shape.type()
        if candidate.shape.type() != row_type:
            return Reason("dtype_mismatch", f"{candidate.shape.type()} in a {row_type} row")
        if row_type not in FLOAT_TYPES:
            return Reason("dtype_mismatch", f"rows of {row_type} are not fused")
        return None

    @staticmethod
    def _row_shape(group: FusionGroup, seed: Instruction, candidate: Instruction) -> Reason | None:
        """Is the candidate a row op of the seed's row (a reduction of it, a broadcast back over
        it, element-wise work on the full or the reduced lens)?"""
        full, reduced = _row_shapes(seed)
        lens = tuple(candidate.shape.lens())
        name = candidate.op.name
        if name in REDUCE_LIKE:
            if trailing_axes(candidate) is None:
                return Reason("reduce_not_last_axis", f"{candidate.op} is not over the last axes")
            if _row_shapes(candidate) != (full, reduced):
                return Reason("shape_mismatch", f"another row: {_describe(candidate)}")
        elif name == "multibroadcast":
            if candidate.inputs[0] not in group:
                return Reason("not_fusible", "a broadcast of a value from outside stays an input")
            if lens != full:
                return Reason("shape_mismatch", f"broadcast to {list(lens)}, not the row")
        elif name == "pointwise" or isinstance(candidate.op, Pointwise):
            if lens not in (full, reduced):
                return Reason("shape_mismatch", f"lens {list(lens)} are not the row's")
        else:
            return Reason("not_fusible", f"{name} cannot be part of a row")
        return None


class FusionTrace:
    """`PGX_TRACE_FUSION=1`: refusals and formed groups on stderr, named as the module prints."""

    def __init__(self, pass_name: str, module: Module) -> None:
        self.pass_name = pass_name
        self.enabled = os.environ.get("PGX_TRACE_FUSION", "").strip() not in ("", "0")
        self.names = instruction_names(module) if self.enabled else {}

    def _name(self, ins: Instruction) -> str:
        return f"{self.names.get(id(ins), '?')} ({ins.op.name})"

    def refused(self, group: FusionGroup, candidate: Instruction, reason: Reason) -> None:
        if self.enabled:
            into = self._name(group.seed) if group.seed is not None else "a new group"
            print(
                f"{self.pass_name}: refused {self._name(candidate)} into the group of {into}: "
                f"{reason}",
                file=sys.stderr,
            )

    def formed(self, module_name: str, members: list[Instruction], fused: Instruction) -> None:
        if self.enabled:
            self.names[id(fused)] = module_name
            ops = [op for m in members for op in inner_op_names(m)]
            print(
                f"{self.pass_name}: formed {module_name} from "
                f"{', '.join(self._name(m) for m in members)}: ops {ops}",
                file=sys.stderr,
            )


class FusionSite:
    """Where a fusion pass works: `module` of `program` with the target's policy (the default
    one if None) and a trace; it numbers the bodies it creates (`main:pointwise0`, ...) and puts
    one instruction running each in place of its group."""

    def __init__(
        self,
        pass_name: str,
        kind: str,
        module: Module,
        program: Program,
        policy: FusionPolicy | None,
    ) -> None:
        self.module, self.program, self.kind = module, program, kind
        self.policy = policy or DefaultFusion()
        self.trace = FusionTrace(pass_name, module)
        prefix = f"{module.name}:{kind}"
        self.counter = sum(1 for name in program.modules if name.startswith(prefix))

    def new_body(self) -> Module:
        """A new, empty sub-module of `module` named after the next number."""
        name = f"{self.module.name}:{self.kind}{self.counter}"
        self.counter += 1
        return self.program.create_module(name, parent=self.module)

    def replace(
        self, members: list[Instruction], op: Op, external: list[Instruction], body: Module
    ) -> Instruction:
        """Put one `op` instruction (inputs `external`, running `body`) in place of `members`,
        whose last one's value is the group's result; the trace reports it."""
        last = members[-1]
        fused = self.module.insert_instruction(last, op, external, [body])
        fused.source = merge_sources(members)  # run-time errors name every member's node
        self.module.replace_instruction(last, fused)
        self.module.remove_instructions(set(members))
        self.trace.formed(body.name, members, fused)
        return fused
