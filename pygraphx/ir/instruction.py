"""Instructions: one SSA value of a module (an operator applied to earlier instructions).

An instruction holds its operator, its input instructions, the sub-modules it calls (If/Loop
bodies, fused groups), its output shape, and the list of instructions that use it. Modules keep
the use lists consistent; passes change instructions only through the module's methods.

Provenance: `source` names the ONNX node(s) an instruction computes, as labels like
`'layer1/conv2' Conv` (`Conv #12` for an unnamed node: its op type and index in its graph;
`com.microsoft::Attention` for a node outside the default domain). A new instruction takes the
labels of the `node_source` block it is made in (the ONNX parser wraps each node's handler in
one); the module's insert/replace helpers carry them through passes, and fusion lists every
member's. Run-time errors name them (`describe_sources`); `()` means none is known.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, TypeVar

from pygraphx.ir.op import Op
from pygraphx.ir.shape import Shape

if TYPE_CHECKING:
    from pygraphx.ir.argument import Literal
    from pygraphx.ir.module import Module

_T = TypeVar("_T")

#: the ONNX node labels new instructions take (set by `node_source`)
_CURRENT_SOURCE: ContextVar[tuple[str, ...]] = ContextVar("pygraphx_node_source", default=())
#: at most this many node labels are listed in an error message
SOURCES_SHOWN = 6


class Instruction:
    """`op(inputs)` with output `shape`; `outputs` are the instructions that use this one."""

    __slots__ = (
        "op",
        "inputs",
        "module_inputs",
        "shape",
        "outputs",
        "module",
        "source",
        "__weakref__",
    )

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
        #: labels of the ONNX node(s) this instruction computes (see the module docstring)
        self.source: tuple[str, ...] = _CURRENT_SOURCE.get()

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


class node_source:  # noqa: N801 - used as a function: `with node_source(labels): ...`
    """Instructions made inside this block record `labels` as their `source` (a class, not a
    generator: the parser enters one per node)."""

    __slots__ = ("labels", "token")

    def __init__(self, labels: tuple[str, ...]) -> None:
        self.labels = labels
        self.token: Token[tuple[str, ...]] | None = None

    def __enter__(self) -> None:
        self.token = _CURRENT_SOURCE.set(self.labels)

    def __exit__(self, *exc: object) -> None:
        if self.token is not None:
            _CURRENT_SOURCE.reset(self.token)


def merge_sources(instructions: Iterable[Instruction]) -> tuple[str, ...]:
    """The node labels of `instructions`, each once, in order of first appearance."""
    return tuple(dict.fromkeys(label for ins in instructions for label in ins.source))


def folded_sources(ins: Instruction, limit: int = 64) -> tuple[str, ...]:
    """The node labels of `ins` and of the computed instructions above it that only it uses,
    transitively (at most `limit`; literals and parameters left out), roughly in graph order:
    what a rewrite replacing `ins` by a new instruction folds into it, so that a run-time error
    there names every node it now computes."""
    dead = [ins]
    dead_ids = {id(ins)}
    stack = list(ins.inputs)
    while stack and len(dead) < limit:
        x = stack.pop()
        if id(x) in dead_ids or x.is_literal() or x.is_param():
            continue
        if all(id(u) in dead_ids for u in x.outputs):  # else: pushed again if a user dies
            dead.append(x)
            dead_ids.add(id(x))
            stack.extend(x.inputs)
    return merge_sources(reversed(dead))


def describe_sources(sources: tuple[str, ...]) -> str:
    """`(ONNX node 'a' Relu)`, `(ONNX nodes 'a' Relu, 'b' Add)`, or '' when none is known."""
    if not sources:
        return ""
    if len(sources) == 1:
        return f"(ONNX node {sources[0]})"
    shown = ", ".join(sources[:SOURCES_SHOWN])
    if len(sources) > SOURCES_SHOWN:
        shown += f", ... ({len(sources)} nodes)"
    return f"(ONNX nodes {shown})"


def with_sources(message: str, sources: tuple[str, ...]) -> str:
    """`message` ending with `describe_sources(sources)`, unless it names an ONNX node already
    (an error raised inside a sub-module whose instructions know their nodes)."""
    if not sources or "(ONNX node" in message:
        return message
    return f"{message} {describe_sources(sources)}"


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
