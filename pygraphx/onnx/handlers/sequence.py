"""ONNX sequences and optionals, resolved at parse time (the IR holds tensors only).

A sequence value is a `SequenceValue`: the list of instructions of its elements, which the
parser keeps while it walks the graph; an optional is an `OptionalValue` holding its element or
nothing. So SequenceConstruct / SequenceEmpty / SequenceInsert / SequenceErase / SequenceAt /
SequenceLength / ConcatFromSequence / SplitToSequence / SequenceMap and Optional /
OptionalHasElement / OptionalGetElement become ordinary tensor instructions (slices, concats,
literals), which is what a static graph compiler can do. What needs a value known at compile
time: insert/erase positions, split sizes, the sequence's length. A position known only at run
time is still fine for SequenceAt when every element has the same shape (`sequence_at` op).

Not representable: sequences as graph inputs or outputs (programs take and return tensors), an
optional graph input that is absent at run time (parameters are always given, so
OptionalHasElement of a graph input is true), and sequences whose length depends on run-time
data (a Loop appending to a sequence for a run-time trip count).

Handlers that accept these values are marked with `@takes_sequences`; the parser refuses to give
a sequence or optional to any other handler (Identity passes them through).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext, onnx_type_to_shape_type
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops.copy_ops import Concat
from pygraphx.ops.layout import Slice, Squeeze, Unsqueeze
from pygraphx.ops.sequence import SequenceAt


@dataclass(eq=False)
class SequenceValue:
    """An ONNX sequence known at compile time: its elements' instructions, in order."""

    items: list[Instruction] = field(default_factory=list)
    elem_type: str | None = None  # the elements' shape type, known even when it is empty

    def __post_init__(self) -> None:
        if self.elem_type is None and self.items:
            self.elem_type = self.items[0].shape.type()

    def describe(self) -> str:
        return f"a sequence of {len(self.items)} {self.elem_type or 'unknown-type'} tensor(s)"


@dataclass(eq=False)
class OptionalValue:
    """An ONNX optional: its element (a tensor or a sequence), or None when it is empty."""

    item: Instruction | SequenceValue | None = None

    def describe(self) -> str:
        if self.item is None:
            return "an empty optional"
        inner = "a tensor" if isinstance(self.item, Instruction) else self.item.describe()
        return f"an optional holding {inner}"


Value = Instruction | SequenceValue | OptionalValue
Args = list[Value | None]


def takes_sequences(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a handler as one that accepts sequence and optional values as inputs."""
    fn.takes_sequences = True  # type: ignore[attr-defined]
    return fn


def describe(value: Value | None) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, Instruction):
        return f"a tensor ({value.shape.type()}, {value.shape.lens()})"
    return value.describe()


# --- flattening structured values to tensors (If branches) ---------------------------------


def flatten_values(values: Sequence[Value]) -> tuple[tuple[Any, ...], list[Instruction]]:
    """The structure of `values` (sequence lengths, optional presence) and their tensors."""
    flat: list[Instruction] = []

    def walk(v: Value | None) -> Any:
        if isinstance(v, Instruction):
            flat.append(v)
            return "tensor"
        if isinstance(v, SequenceValue):
            return ("sequence", tuple(walk(i) for i in v.items))
        if isinstance(v, OptionalValue):
            return ("optional", None if v.item is None else walk(v.item))
        raise TypeError(f"not a value: {v!r}")

    structure = tuple(walk(v) for v in values)
    return structure, flat


def unflatten_values(
    structure: tuple[Any, ...], tensors: Iterator[Instruction], like: Sequence[Value]
) -> list[Value]:
    """Rebuild values of `structure` from `tensors` (element types taken from `like`)."""

    def build(s: Any, ref: Value | None) -> Value:
        if s == "tensor":
            return next(tensors)
        kind, inner = s
        if kind == "sequence":
            assert isinstance(ref, SequenceValue)
            items = [build(i, r) for i, r in zip(inner, ref.items, strict=True)]
            return SequenceValue(items, ref.elem_type)  # type: ignore[arg-type]
        assert isinstance(ref, OptionalValue)
        return OptionalValue(None if inner is None else build(inner, ref.item))  # type: ignore[arg-type]

    return [build(s, r) for s, r in zip(structure, like, strict=True)]


# --- helpers ----------------------------------------------------------------------------------


def _sequence(ctx: NodeContext, v: Value | None, what: str = "input_sequence") -> SequenceValue:
    if isinstance(v, SequenceValue):
        return v
    raise ctx.error(f"input {what!r} must be a sequence, got {describe(v)}")


def _tensor(ctx: NodeContext, v: Value | None, what: str) -> Instruction:
    if isinstance(v, Instruction):
        return v
    raise ctx.error(f"input {what!r} must be a tensor, got {describe(v)}")


def _position(ctx: NodeContext, ins: Value | None, n: int, insert: bool) -> int:
    """A compile-time position, checked against ONNX's range and made non-negative."""
    p = int(np.asarray(ctx.require_const(_tensor(ctx, ins, "position"), "position")).reshape(-1)[0])
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise ctx.error(f"position {p} is out of range [{-n}, {hi}] for {n} element(s)")
    return p + n if p < 0 else p


def _check_type(ctx: NodeContext, seq: SequenceValue, x: Instruction) -> None:
    if seq.elem_type is not None and x.shape.type() != seq.elem_type:
        raise ctx.error(
            f"tensor of type {x.shape.type()} does not fit a sequence of {seq.elem_type}"
        )


def _axis(ctx: NodeContext, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


# --- sequences --------------------------------------------------------------------------------


@onnx_op("SequenceConstruct", since=11)
@takes_sequences
def parse_sequence_construct(ctx: NodeContext, args: Args) -> SequenceValue:
    items = [_tensor(ctx, a, f"inputs[{k}]") for k, a in enumerate(args)]
    types = {i.shape.type() for i in items}
    if len(types) > 1:
        raise ctx.error(f"sequence elements have different types {sorted(types)}")
    return SequenceValue(items)


@onnx_op("SequenceEmpty", since=11)
@takes_sequences
def parse_sequence_empty(ctx: NodeContext, args: Args) -> SequenceValue:
    dtype = ctx.attr("dtype", 1)  # TensorProto.FLOAT
    try:
        return SequenceValue([], onnx_type_to_shape_type(dtype))
    except ValueError as exc:
        raise ctx.error(str(exc)) from None


@onnx_op("SequenceInsert", since=11)
@takes_sequences
def parse_sequence_insert(ctx: NodeContext, args: Args) -> SequenceValue:
    seq = _sequence(ctx, args[0])
    x = _tensor(ctx, args[1], "tensor")
    _check_type(ctx, seq, x)
    n = len(seq.items)
    pos = n if len(args) < 3 or args[2] is None else _position(ctx, args[2], n, insert=True)
    items = list(seq.items)
    items.insert(pos, x)
    return SequenceValue(items, seq.elem_type or x.shape.type())


@onnx_op("SequenceErase", since=11)
@takes_sequences
def parse_sequence_erase(ctx: NodeContext, args: Args) -> SequenceValue:
    seq = _sequence(ctx, args[0])
    n = len(seq.items)
    if n == 0:
        raise ctx.error("cannot erase from an empty sequence")
    pos = n - 1 if len(args) < 2 or args[1] is None else _position(ctx, args[1], n, insert=False)
    items = list(seq.items)
    del items[pos]
    return SequenceValue(items, seq.elem_type)


@onnx_op("SequenceAt", since=11)
@takes_sequences
def parse_sequence_at(ctx: NodeContext, args: Args) -> Instruction:
    seq = _sequence(ctx, args[0])
    pos = _tensor(ctx, args[1], "position")
    n = len(seq.items)
    if n == 0:
        raise ctx.error("SequenceAt of an empty sequence")
    if ctx.const(pos) is not None:
        return seq.items[_position(ctx, pos, n, insert=False)]
    # a run-time position (a loop's iteration number, say): pick among same-shaped elements
    shapes = {(tuple(i.shape.lens()), i.shape.type()) for i in seq.items}
    if len(shapes) > 1:
        raise ctx.error(
            "the position is a run-time value and the elements have different shapes "
            f"{sorted(list(s[0]) for s in shapes)}: the output shape would depend on run-time data"
        )
    return ctx.add(SequenceAt(), pos, *seq.items)


@onnx_op("SequenceLength", since=11)
@takes_sequences
def parse_sequence_length(ctx: NodeContext, args: Args) -> Instruction:
    seq = _sequence(ctx, args[0])
    return ctx.literal(np.array(len(seq.items), dtype=np.int64))


@onnx_op("ConcatFromSequence", since=11)
@takes_sequences
def parse_concat_from_sequence(ctx: NodeContext, args: Args) -> Instruction:
    seq = _sequence(ctx, args[0])
    if not seq.items:
        raise ctx.error("ConcatFromSequence of an empty sequence")
    new_axis = ctx.attr("new_axis", 0)
    rank = seq.items[0].shape.ndim()
    axis = _axis(ctx, ctx.attr("axis"), rank + 1 if new_axis else rank)
    items = list(seq.items)
    if new_axis:
        items = [ctx.add(Unsqueeze((axis,)), i) for i in items]
    if len(items) == 1:
        return items[0]
    return ctx.add(Concat(axis), *items)


@onnx_op("SplitToSequence", since=11)
@takes_sequences
def parse_split_to_sequence(ctx: NodeContext, args: Args) -> SequenceValue:
    x = _tensor(ctx, args[0], "input")
    lens = x.shape.lens()
    axis = _axis(ctx, ctx.attr("axis", 0), len(lens))
    n = lens[axis]
    split = args[1] if len(args) > 1 else None
    if split is None:
        parts = [ctx.add(Slice((axis,), (k,), (k + 1,)), x) for k in range(n)]
        if not ctx.attr("keepdims", 1):
            parts = [ctx.add(Squeeze((axis,)), p) for p in parts]
        return SequenceValue(parts, x.shape.type())
    sizes_arr = np.asarray(ctx.require_const(_tensor(ctx, split, "split"), "split"))
    if sizes_arr.ndim == 0:
        chunk = int(sizes_arr)
        if chunk <= 0:
            raise ctx.error(f"split size {chunk} must be positive")
        sizes = [min(chunk, n - s) for s in range(0, n, chunk)]
    else:
        sizes = [int(s) for s in sizes_arr.reshape(-1)]
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            raise ctx.error(f"split sizes {sizes} do not add up to the length {n} of axis {axis}")
    parts, start = [], 0
    for s in sizes:
        parts.append(ctx.add(Slice((axis,), (start,), (start + s,)), x))
        start += s
    return SequenceValue(parts, x.shape.type())


@onnx_op("SequenceMap", since=17)
@takes_sequences
def parse_sequence_map(ctx: NodeContext, args: Args) -> list[SequenceValue]:
    """Unrolled at parse time: the body is inlined once per element."""
    body = ctx.attr("body")
    first = _sequence(ctx, args[0])
    n = len(first.items)
    for k, a in enumerate(args):
        if isinstance(a, SequenceValue) and len(a.items) != n:
            raise ctx.error(f"input {k} has {len(a.items)} elements, input 0 has {n}")
        if not isinstance(a, SequenceValue | Instruction):
            raise ctx.error(f"input {k} must be a sequence or a tensor, got {describe(a)}")
    outputs: list[list[Instruction]] = [[] for _ in body.output]
    for i in range(n):
        bound = [a.items[i] if isinstance(a, SequenceValue) else a for a in args]
        outs = ctx.inline(body, bound, f"body of {ctx.describe()} (element {i})")
        for acc, o in zip(outputs, outs, strict=True):
            acc.append(_tensor(ctx, o, "body output"))
    result = []
    for acc, out in zip(outputs, body.output, strict=True):
        elem = None
        tt = (
            out.type.sequence_type.elem_type.tensor_type
            if out.type.HasField("sequence_type")
            else out.type.tensor_type
        )
        if not acc and tt.elem_type:
            elem = onnx_type_to_shape_type(tt.elem_type)
        result.append(SequenceValue(acc, elem))
    return result


# --- optionals --------------------------------------------------------------------------------


@onnx_op("Optional", since=15)
@takes_sequences
def parse_optional(ctx: NodeContext, args: Args) -> OptionalValue:
    item = args[0] if args else None
    if isinstance(item, OptionalValue):
        raise ctx.error("an optional cannot hold an optional")
    return OptionalValue(item)


@onnx_op("OptionalHasElement", since=15)
@takes_sequences
def parse_optional_has_element(ctx: NodeContext, args: Args) -> Instruction:
    v = args[0] if args else None
    present = v.item is not None if isinstance(v, OptionalValue) else v is not None
    return ctx.literal(np.array(present, dtype=np.bool_))


@onnx_op("OptionalGetElement", since=15)
@takes_sequences
def parse_optional_get_element(ctx: NodeContext, args: Args) -> Value:
    v = args[0] if args else None
    if isinstance(v, OptionalValue):
        if v.item is None:
            raise ctx.error("the optional is empty: it has no element to get")
        return v.item
    if v is None:
        raise ctx.error("OptionalGetElement needs an input")
    return v
