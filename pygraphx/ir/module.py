"""Modules: an ordered list of instructions in SSA form (a graph, or a sub-graph).

`add_parameter`, `add_literal`, `add_instruction` and `add_return` build a module in order;
`insert_instruction`, `replace_instruction`, `replace_op` and `remove_instruction` edit it while
keeping every use list right; `validate()` checks the invariants passes must preserve (inputs
defined before use, use lists consistent, shapes as the operators compute them). Edits keep the
ONNX nodes instructions come from (`Instruction.source`): an inserted instruction takes those
of the one it is inserted before, a replacement with none of its own those of the replaced.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.builtin_ops import LiteralOp, Param, Return
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.op import Op, ShapeError
from pygraphx.ir.shape import Shape


class ModuleError(ValueError):
    """An edit or check of a module that would break its invariants."""


class Module:
    """A named, ordered list of instructions."""

    def __init__(self, name: str = "main") -> None:
        self.name = name
        self.instructions: list[Instruction] = []
        self.parent: Module | None = None
        self.memory_plan: Any = None  # set by the memory_coloring pass
        self._shape_checked: dict[int, tuple] = {}  # what validate() last checked

    # --- building -----------------------------------------------------------------------
    def add_parameter(self, name: str, shape: Shape) -> Instruction:
        if any(i.is_param() and i.op.parameter == name for i in self.instructions):
            raise ModuleError(f"module {self.name!r} already has a parameter named {name!r}")
        ins = Instruction(Param(name, shape), [], shape, self)
        self.instructions.append(ins)
        return ins

    def add_literal(self, value: Literal | np.ndarray | Any) -> Instruction:
        lit = value if isinstance(value, Literal) else Literal(np.asarray(value))
        ins = Instruction(LiteralOp(lit), [], lit.get_shape(), self)
        self.instructions.append(ins)
        return ins

    def add_instruction(
        self,
        op: Op,
        inputs: Sequence[Instruction] = (),
        module_inputs: Sequence[Module] = (),
    ) -> Instruction:
        if self.instructions and self.instructions[-1].is_return():
            raise ModuleError(
                f"module {self.name!r} already ends with @return; use insert_instruction"
            )
        ins = self._make(op, inputs, module_inputs)
        self.instructions.append(ins)
        return ins

    def add_return(self, inputs: Sequence[Instruction]) -> Instruction:
        if self.instructions and self.instructions[-1].is_return():
            raise ModuleError(f"module {self.name!r} already ends with @return")
        return self.add_instruction(Return(), inputs)

    def insert_instruction(
        self,
        before: Instruction,
        op: Op,
        inputs: Sequence[Instruction] = (),
        module_inputs: Sequence[Module] = (),
    ) -> Instruction:
        pos = self.position(before)
        ins = self._make(op, inputs, module_inputs)
        ins.source = ins.source or before.source  # a rewrite of `before` computes its node
        self.instructions.insert(pos, ins)
        return ins

    def insert_literal(self, before: Instruction, value: Literal | np.ndarray) -> Instruction:
        lit = value if isinstance(value, Literal) else Literal(np.asarray(value))
        ins = Instruction(LiteralOp(lit), [], lit.get_shape(), self)
        ins.source = ins.source or before.source
        self.instructions.insert(self.position(before), ins)
        return ins

    def _make(
        self, op: Op, inputs: Sequence[Instruction], module_inputs: Sequence[Module]
    ) -> Instruction:
        inputs = list(inputs)
        for i in inputs:
            if not isinstance(i, Instruction):
                raise ModuleError(f"{op.name}: input {i!r} is not an instruction")
        shape = compute_shape(op, inputs, module_inputs)
        ins = Instruction(op, inputs, shape, self, list(module_inputs))
        for i in inputs:
            if ins not in i.outputs:
                i.outputs.append(ins)
        return ins

    # --- editing ------------------------------------------------------------------------
    def position(self, ins: Instruction) -> int:
        try:  # instructions compare by identity, so `index` finds this very one
            return self.instructions.index(ins)
        except ValueError:
            raise ModuleError(f"instruction {ins.op.name} is not in module {self.name!r}") from None

    def replace_instruction(self, ins: Instruction, rep: Instruction) -> Instruction:
        """Make every user of `ins` use `rep` instead (the shapes must match); a `rep` with no
        ONNX node of its own takes those of `ins` (it computes that node's value now)."""
        if ins is rep:
            return rep
        if ins.shape.lens() != rep.shape.lens() or ins.shape.type() != rep.shape.type():
            raise ModuleError(
                f"cannot replace {ins.op.name} ({ins.shape}) with {rep.op.name} ({rep.shape})"
            )
        # a user that is `rep` itself keeps `ins` (the "insert f(x), then replace x" edit)
        users = [u for u in ins.outputs if u is not rep]
        for user in users:
            user.inputs = [rep if x is ins else x for x in user.inputs]
            if user not in rep.outputs:
                rep.outputs.append(user)
        ins.outputs = [rep] if rep in ins.outputs else []
        if not rep.source and not rep.is_param():
            rep.source = ins.source
        self._recompute_shapes(users)
        return rep

    def _recompute_shapes(self, start: list[Instruction]) -> None:
        """Re-derive the shapes of `start` and, where they change, of their users."""
        work = list(start)
        while work:
            ins = work.pop()
            if ins.is_return():
                continue
            shape = compute_shape(ins.op, ins.inputs, ins.module_inputs)
            if shape != ins.shape:
                if shape.lens() != ins.shape.lens() or shape.type() != ins.shape.type():
                    raise ModuleError(
                        f"{ins.op}: an input change alters its shape {ins.shape} -> {shape}"
                    )
                ins.shape = shape
                work.extend(ins.outputs)

    def replace_op(
        self, ins: Instruction, op: Op, inputs: Sequence[Instruction] | None = None
    ) -> Instruction:
        """Change the operator (and optionally inputs) of `ins` in place, keeping its users."""
        new_inputs = list(ins.inputs if inputs is None else inputs)
        shape = compute_shape(op, new_inputs, ins.module_inputs)
        if shape.lens() != ins.shape.lens() or shape.type() != ins.shape.type():
            raise ModuleError(
                f"replacing {ins.op.name} with {op.name} changes the shape {ins.shape} -> {shape}"
            )
        for i in ins.inputs:
            if ins in i.outputs:
                i.outputs.remove(ins)
        changed = shape != ins.shape
        ins.op, ins.inputs, ins.shape = op, new_inputs, shape
        for i in new_inputs:
            if ins not in i.outputs:
                i.outputs.append(ins)
        if changed:
            self._recompute_shapes(list(ins.outputs))
        return ins

    def remove_instruction(self, ins: Instruction) -> None:
        if ins.outputs:
            raise ModuleError(f"cannot remove {ins.op.name}: it still has users")
        self.instructions.pop(self.position(ins))
        for i in ins.inputs:
            while ins in i.outputs:
                i.outputs.remove(ins)

    def remove_instructions(self, dead: set[Instruction]) -> None:
        """Remove many instructions at once (none of their users may survive)."""
        keep = [i for i in self.instructions if i not in dead]
        for ins in dead:
            for i in ins.inputs:
                i.outputs = [u for u in i.outputs if u is not ins]
        self.instructions = keep

    # --- queries ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def __len__(self) -> int:
        return len(self.instructions)

    def get_parameters(self) -> list[Instruction]:
        return [i for i in self.instructions if i.is_param()]

    def get_parameter_names(self) -> list[str]:
        return [i.op.parameter for i in self.get_parameters()]

    def get_parameter_shapes(self) -> dict[str, Shape]:
        """Parameter name -> shape (the dynamic shape for parameters that have one)."""
        return {i.op.parameter: i.op.dynamic_shape or i.shape for i in self.get_parameters()}

    def get_parameter(self, name: str) -> Instruction:
        for i in self.get_parameters():
            if i.op.parameter == name:
                return i
        raise KeyError(f"module {self.name!r} has no parameter {name!r}")

    def get_returns(self) -> list[Instruction]:
        if self.instructions and self.instructions[-1].is_return():
            return list(self.instructions[-1].inputs)
        return [self.instructions[-1]] if self.instructions else []

    def get_output_shapes(self) -> list[Shape]:
        return [i.shape for i in self.get_returns()]

    def validate(self) -> None:
        """Raise `ModuleError` naming the first instruction that breaks an invariant.

        An instruction whose operator is the very object the last `validate()` checked, and
        whose shape and input shapes equal the ones it checked, is not re-derived (operators
        and shapes are immutable, so the answer cannot have changed); instructions that call
        sub-modules always are.
        """
        seen: set[int] = set()
        outer: set[int] | None = None  # the enclosing modules' instructions, when first needed
        members = {id(i) for i in self.instructions}
        checked = getattr(self, "_shape_checked", {})
        now: dict[int, tuple] = {}
        last = len(self.instructions) - 1
        for k, ins in enumerate(self.instructions):
            if ins.module is not self:
                raise ModuleError(f"{self._where(k)}: belongs to another module")
            for i in ins.inputs:
                if id(i) not in seen:
                    outer = _outer_instructions(self) if outer is None else outer
                    if id(i) not in outer:
                        msg = f"input {i.op.name} is not defined before it"
                        raise ModuleError(f"{self._where(k)}: {msg}")
                if ins not in i.outputs:
                    msg = f"missing from the users of input {i.op.name}"
                    raise ModuleError(f"{self._where(k)}: {msg}")
            for user in ins.outputs:
                if id(user) not in members and user.module is self:
                    raise ModuleError(f"{self._where(k)}: user {user.op.name} is not in the module")
                if ins not in user.inputs:
                    raise ModuleError(f"{self._where(k)}: stale user {user.op.name}")
            if k != last and ins.is_return():
                raise ModuleError(f"{self._where(k)}: @return is not the last instruction")
            stamp = _shape_stamp(ins)
            if not _same_stamp(checked.get(id(ins)), stamp):
                _check_shape(ins, self._where(k))
            now[id(ins)] = stamp
            seen.add(id(ins))
        self._shape_checked = now

    def _where(self, k: int) -> str:
        return f"module {self.name!r}, instruction {k} ({self.instructions[k].op.name})"

    def __str__(self) -> str:
        from pygraphx.ir.printer import print_module

        return print_module(self)


def _shape_stamp(ins: Instruction) -> tuple:
    """What an instruction's shape is derived from, plus the instruction and its shape."""
    return (ins, ins.op, ins.shape, [i.shape for i in ins.inputs], ins.module_inputs)


def _same_stamp(old: tuple | None, new: tuple) -> bool:
    """Whether `new` has the very instruction and operator of `old` and equal shapes (so the
    operator must give the same shape again), and calls no sub-module."""
    if old is None or new[4]:
        return False
    return old[0] is new[0] and old[1] is new[1] and old[2] == new[2] and old[3] == new[3]


def _check_shape(ins: Instruction, where: str) -> None:
    try:
        shape = compute_shape(ins.op, ins.inputs, ins.module_inputs)
    except ShapeError as exc:
        raise ModuleError(f"{where}: {exc}") from exc
    if not ins.is_return() and shape != ins.shape:
        raise ModuleError(f"{where}: stored shape {ins.shape} but the op gives {shape}")


def _outer_instructions(module: Module) -> set[int]:
    ids: set[int] = set()
    parent = module.parent
    while parent is not None:
        ids.update(id(i) for i in parent.instructions)
        parent = parent.parent
    return ids


def compute_shape(
    op: Op, inputs: Sequence[Instruction], module_inputs: Sequence[Module] = ()
) -> Shape:
    """The output shape of `op` on `inputs`; errors name the operator and the input shapes."""
    shapes = [i.shape for i in inputs]
    try:
        if module_inputs:
            return op.compute_shape(shapes, module_inputs)  # type: ignore[call-arg]
        return op.compute_shape(shapes)
    except ShapeError:
        raise
    except (ValueError, IndexError, TypeError) as exc:
        listed = "; ".join(str(s) for s in shapes)
        raise ShapeError(f"{op}: cannot compute the output shape of ({listed}): {exc}") from exc
