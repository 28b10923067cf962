"""Instructions: one SSA value of a module (an operator applied to earlier instructions).

An instruction holds its operator, its input instructions, the sub-modules it calls (If/Loop
bodies, fused groups), its output shape, and the list of instructions that use it. Modules keep
the use lists consistent; passes change instructions only through the module's methods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

from pygraphx.ir.op import Op
from pygraphx.ir.shape import Shape

if TYPE_CHECKING:
    from pygraphx.ir.argument import Literal
    from pygraphx.ir.module import Module

_T = TypeVar("_T")


class Instruction:
    """`op(inputs)` with output `shape`; `outputs` are the instructions that use this one."""

    __slots__ = ("op", "inputs", "module_inputs", "shape", "outputs", "module", "__weakref__")

    def __init__(
        self,
        op: Op,
        inputs: list[Instruction],
        shape: Shape,
        module: Module,
        module_inputs: list[Module] | None = None,
    ) -> None:
        self.op = op
        self.inputs = inputs
        self.module_inputs = module_inputs or []
        self.shape = shape
        self.outputs: list[Instruction] = []
        self.module = module

    # MIGraphX-style accessors
    def name(self) -> str:
        return self.op.name

    def get_operator(self) -> Op:
        return self.op

    def get_shape(self) -> Shape:
        return self.shape

    def is_param(self) -> bool:
        return self.op.name == "@param"

    def is_literal(self) -> bool:
        return self.op.name == "@literal"

    def is_return(self) -> bool:
        return self.op.name == "@return"

    def get_literal(self) -> Literal:
        if not self.is_literal():
            raise ValueError(f"instruction {self.op.name} is not a literal")
        return self.op.literal  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"<instruction {self.op.name} -> {self.shape}>"


def reachable(start: Iterable[_T], step: Callable[[_T], Iterable[_T]]) -> Iterator[_T]:
    """`start` and every node reached from it through `step` (an instruction's `inputs`, a
    filter of its `outputs`, the modules a module calls), each once, depth first with an
    explicit stack (graphs can be deep)."""
    seen: set[int] = set()
    stack = list(start)
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        stack.extend(step(x))
