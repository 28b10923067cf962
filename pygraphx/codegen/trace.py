"""Fused groups as data: the trace of a `pointwise` or `fused_reduce` sub-module.

A group's body is traced once through each operator's `apply(o, ...)` with a recording handler
(`Tracer`), giving a flat list of ops-handler primitives (`add`, `exp`, `where`, ...) with
constants folded. `group_trace(ins)` adds what a code generator needs around it: every input's
lens, strides (a broadcast is a zero stride) and dtype, the reduction (op and axes, kept as
length 1) between the prologue and the epilogue steps, and the output. Nothing here knows
torch: `evaluate(group, o, inputs)` runs the description through any `OpsHandler` (numpy for
the reference, torch for cpu/gpu eager, the Triton emitter to write a kernel), computing
fp16/bf16/fp8 values in `compute_dtype` and rounding only where the description casts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ir.shape import Shape
from pygraphx.ops import make_op
from pygraphx.ops.activation import NATIVE_ACTIVATIONS
from pygraphx.ops.handler import NUMPY, PRIMITIVES, accumulation_dtype, compute_dtype
from pygraphx.ops.pointwise import Pointwise
from pygraphx.ops.reduce import normalize_axes


class NotTraceable(Exception):
    """The body cannot be traced into handler primitives (the caller falls back)."""


@dataclass
class Value:
    """A traced value: an input (`kind="in"`), a constant, or a primitive's result."""

    kind: str  # "in" | "const" | "node"
    dtype: np.dtype
    index: int = -1  # input number or node number
    const: Any = None  # the numpy scalar of a constant


@dataclass
class Node:
    fn: str
    args: list[Any]  # Values, or plain attributes (a dtype for `cast`, axes for reductions)
    dtype: np.dtype


@dataclass
class Trace:
    inputs: list[Value]
    nodes: list[Node] = field(default_factory=list)


_PRIMITIVES = frozenset(PRIMITIVES) - {"compute_dtype"}
#: reduction steps: the handler's reductions and the two normalisations built from them
REDUCTIONS = frozenset(
    ["reduce_sum", "reduce_prod", "reduce_max", "reduce_min", "reduce_mean", "softmax",
     "logsoftmax"]
)  # fmt: skip


class Tracer:
    """An ops handler that records primitives instead of computing them."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace

    def __getattr__(self, name: str) -> Callable[..., Value]:
        if name not in _PRIMITIVES:
            raise NotTraceable(f"unknown ops-handler primitive {name!r}")

        def record(*args: Any) -> Value:
            return self._record(name, args)

        return record

    def constant(self, value: Any, like: Value) -> Value:
        arr = np.asarray(value, dtype=like.dtype)
        return Value("const", arr.dtype, const=arr)

    def reduce(self, fn: str, x: Value, axes: tuple[int, ...]) -> Value:
        """Record a reduction step (`REDUCTIONS`) over `axes`."""
        if fn in ("reduce_sum", "reduce_prod", "reduce_mean"):
            dtype = accumulation_dtype(x.dtype)
        elif fn in ("softmax", "logsoftmax"):
            dtype = compute_dtype(x.dtype)
        else:
            dtype = np.dtype(x.dtype)
        self.trace.nodes.append(Node(fn, [x, tuple(axes)], dtype))
        return Value("node", dtype, index=len(self.trace.nodes) - 1)

    def _record(self, name: str, args: Sequence[Any]) -> Value:
        probes = [_probe(a) for a in args]
        with np.errstate(all="ignore"):
            result = np.asarray(_numpy_fn(name)(*probes))
        if all(not isinstance(a, Value) or a.kind == "const" for a in args):
            return Value("const", result.dtype, const=result.reshape(()))  # folded
        self.trace.nodes.append(Node(name, list(args), result.dtype))
        return Value("node", result.dtype, index=len(self.trace.nodes) - 1)


def _numpy_fn(name: str) -> Callable[..., Any]:
    """The numpy form of a primitive, or of a native activation (its decomposition)."""
    if name in NATIVE_ACTIVATIONS:
        op = make_op(name)
        return lambda x: op.decompose(NUMPY, x)
    return getattr(NUMPY, name)


def _native_recorder(name: str) -> Callable[[Tracer, Value], Value]:
    def record(self: Tracer, x: Value) -> Value:
        return self._record(name, [x])

    return record


@functools.cache
def tracer_class(native: frozenset[str] = frozenset()) -> type[Tracer]:
    """A `Tracer` that records the activations named in `native` (`ops/activation.py`) as one
    step each, for a handler that runs them natively (torch's `gelu`, ...); other handlers
    (numpy, Triton) get them decomposed into primitives."""
    unknown = native - set(NATIVE_ACTIVATIONS)
    if unknown:
        raise ValueError(f"not native activations: {sorted(unknown)}")
    if not native:
        return Tracer
    return type("NativeTracer", (Tracer,), {n: _native_recorder(n) for n in sorted(native)})


def _probe(a: Any) -> Any:
    """A stand-in numpy value for dtype inference (or the constant itself)."""
    if not isinstance(a, Value):
        return a
    if a.kind == "const":
        return a.const
    return np.ones(1, dtype=a.dtype)


def _reduction_step(tracer: Tracer, ins: Instruction, x: Value) -> Value:
    op = ins.op
    rank = ins.inputs[0].shape.ndim()
    if op.name in ("softmax", "logsoftmax"):
        axes = normalize_axes(op, (op.axis,), rank)
    elif op.name.startswith("reduce_"):
        axes = normalize_axes(op, op.axes, rank)
    else:
        raise NotTraceable(f"{op.name} is neither element-wise nor a reduction")
    if op.name not in REDUCTIONS:
        raise NotTraceable(f"{op.name} has no ops-handler reduction")
    return tracer.reduce(op.name, x, axes)


def _keeps_rank(ins: Instruction) -> bool:
    return ins.inputs[0].shape.ndim() == ins.shape.ndim()


def trace_body(
    body: Module,
    stop: Instruction | None = None,
    consts: dict[int, np.ndarray] | None = None,
    reductions: bool = False,
    native: frozenset[str] = frozenset(),
) -> tuple[Trace, Value]:
    """Trace `body`'s instructions (up to, not including, `stop`); returns the trace and the
    value of the body's result (or of `stop`'s first input). `consts`: parameters known to be
    one number everywhere, folded in as constants. `reductions`: trace reduce-like
    instructions too (as `REDUCTIONS` steps), else they raise `NotTraceable`. `native`:
    activations recorded as one step each (`tracer_class`)."""
    params = body.get_parameters()
    trace = Trace([Value("in", p.shape.dtype(), index=k) for k, p in enumerate(params)])
    tracer = tracer_class(native)(trace)
    values: dict[int, Value] = {id(p): v for p, v in zip(params, trace.inputs, strict=True)}
    for k, value in (consts or {}).items():
        arr = np.asarray(value, dtype=params[k].shape.dtype()).reshape(())
        values[id(params[k])] = Value("const", arr.dtype, const=arr)
    for ins in body.instructions:
        if ins.is_param():
            continue
        if ins is stop or ins.is_return():
            return trace, values[id(ins.inputs[0])]
        args = [values[id(i)] for i in ins.inputs]
        if isinstance(ins.op, Pointwise):
            v = ins.op.apply(tracer, *args)
        elif reductions and ins.op.name == "multibroadcast" and _keeps_rank(ins):
            v = args[0]  # a reduced row value over the row again: keepdims values broadcast
        elif reductions and len(args) == 1:
            v = _reduction_step(tracer, ins, args[0])
        else:
            raise NotTraceable(f"{ins.op.name} is not element-wise")
        if not isinstance(v, Value):
            raise NotTraceable(f"{ins.op.name}: apply returned {type(v).__name__}")
        want = ins.shape.dtype()
        if v.dtype != want:
            v = tracer.cast(v, want)
        values[id(ins)] = v
    raise NotTraceable("body has no @return")


# --- the group description -------------------------------------------------------------------


@dataclass(frozen=True)
class TensorDesc:
    """One tensor a group reads or writes: lens, strides in elements (0 = broadcast), dtype."""

    lens: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype

    @staticmethod
    def of(shape: Shape) -> TensorDesc:
        return TensorDesc(tuple(shape.lens()), tuple(shape.strides()), shape.dtype())


@dataclass
class GroupTrace:
    """A fused group as data. `steps.nodes[:reduce_at]` is the prologue over `lens`; the
    node at `reduce_at` (if any) is the (first) reduction; the rest is the epilogue, which in a
    whole-row group (`RowFusion`: a layer norm) may reduce the same row again and broadcast
    the results back over it. `result` is the value written to `output`."""

    kind: str  # "pointwise" | "fused_reduce"
    name: str  # the body module's name, for messages
    inputs: list[TensorDesc]
    output: TensorDesc
    lens: tuple[int, ...]
    steps: Trace
    result: Value
    reduce_at: int | None = None

    @property
    def reduction(self) -> Node | None:
        return None if self.reduce_at is None else self.steps.nodes[self.reduce_at]


def group_trace(ins: Instruction) -> GroupTrace:
    """The description of a `pointwise` or `fused_reduce` instruction (its sub-module's body,
    its inputs' real lens and strides, its standard output)."""
    if ins.op.name not in ("pointwise", "fused_reduce"):
        raise NotTraceable(f"{ins.op.name} is not a fused group")
    return module_trace(ins.module_inputs[0], [i.shape for i in ins.inputs], ins.op.name)


def module_trace(body: Module, input_shapes: Sequence[Shape], kind: str) -> GroupTrace:
    """The description of `body` read with inputs of `input_shapes` (lens as the parameters)."""
    steps, result = trace_body(body, reductions=(kind == "fused_reduce"))
    reds = [j for j, n in enumerate(steps.nodes) if n.fn in REDUCTIONS]
    rows = {tuple(i.inputs[0].shape.lens()) for i in body.instructions if _is_reduction(i)}
    if len(rows) > 1 or len({steps.nodes[j].args[1] for j in reds}) > 1:
        raise NotTraceable(f"{body.name}: reductions of different rows in one group")
    if kind == "fused_reduce" and not reds:
        raise NotTraceable(f"{body.name}: a fused_reduce group with no reduction")
    if result.kind == "const":
        raise NotTraceable(f"{body.name}: the result is a constant (fold it first)")
    out_shape = body.get_output_shapes()[0].as_standard()
    params = body.get_parameters()
    if len(input_shapes) != len(params):
        raise NotTraceable(f"{body.name}: {len(input_shapes)} inputs for {len(params)} parameters")
    lens = tuple(out_shape.lens())
    if reds:  # the prologue runs over the reduction's input
        red_ins = next(i for i in body.instructions if _is_reduction(i))
        lens = tuple(red_ins.inputs[0].shape.lens())
    return GroupTrace(
        kind=kind,
        name=body.name,
        inputs=[TensorDesc.of(s) for s in input_shapes],
        output=TensorDesc.of(out_shape),
        lens=lens,
        steps=steps,
        result=result,
        reduce_at=reds[0] if reds else None,
    )


def _is_reduction(ins: Instruction) -> bool:
    return not ins.is_param() and not ins.is_return() and ins.op.name in REDUCTIONS


# --- running a description through a handler -------------------------------------------------


def softmax(o: Any, x: Any, axes: Sequence[int], log: bool = False) -> Any:
    """softmax (or logsoftmax) over `axes`, written in the handler's primitives."""
    shifted = o.sub(x, o.reduce_max(x, axes))
    e = o.exp(shifted)
    total = o.reduce_sum(e, axes)
    return o.sub(shifted, o.log(total)) if log else o.div(e, total)


def apply_reduction(o: Any, node: Node, x: Any) -> Any:
    """Run the reduction step `node` on `x` with handler `o`."""
    axes = node.args[1]
    if node.fn in ("softmax", "logsoftmax"):
        return softmax(o, x, axes, log=node.fn == "logsoftmax")
    return getattr(o, node.fn)(x, axes)


def run_steps(
    o: Any,
    nodes: Sequence[Node],
    env: dict[tuple[str, int], Any],
    start: int = 0,
    reduce: Callable[[Node, Any], Any] | None = None,
) -> None:
    """Evaluate `nodes` (numbered from `start`) into `env[("node", j)]`; inputs are
    `env[("in", k)]`, held in their compute dtype. `reduce(node, x)` runs a reduction step
    (default: `apply_reduction` with `o`)."""
    for j, n in enumerate(nodes, start):
        if n.fn in REDUCTIONS:
            x = read(o, n.args[0], env, n)
            r = reduce(n, x) if reduce else apply_reduction(o, n, x)
        elif n.fn in ("cast", "cast_finite"):
            r = _cast(o, read(o, n.args[0], env, n), n.args[1], n.fn)
        else:
            r = getattr(o, n.fn)(*[read(o, a, env, n) for a in n.args])
        env[("node", j)] = r


def read(o: Any, a: Any, env: dict[tuple[str, int], Any], node: Node) -> Any:
    """The handler value of argument `a` of `node` (a constant in its compute dtype)."""
    if not isinstance(a, Value):
        return a
    if a.kind != "const":
        return env[(a.kind, a.index)]
    like = next(
        (env[(v.kind, v.index)] for v in node.args if isinstance(v, Value) and v.kind != "const"),
        None,
    )
    return o.constant(a.const, _Like(compute_dtype(a.dtype), like))


@dataclass
class _Like:
    """What `constant(value, like)` reads: the wanted dtype (and `like`'s device, if any)."""

    dtype: np.dtype
    of: Any = None

    @property
    def device(self) -> Any:
        return getattr(self.of, "device", None)


def _cast(o: Any, x: Any, dtype: np.dtype, fn: str = "cast") -> Any:
    """Cast (`fn`: `cast` or `cast_finite`), then widen back to the compute dtype: a narrow
    cast rounds once, here."""
    want = np.dtype(dtype)
    r = getattr(o, fn)(x, want)
    wide = compute_dtype(want)
    return r if wide == want else o.cast(r, wide)


def evaluate(group: GroupTrace, o: Any, inputs: Sequence[Any]) -> Any:
    """Run `group` with handler `o` on `inputs` (values of the inputs' lens); the result has
    the output's dtype and lens."""
    env: dict[tuple[str, int], Any] = {}
    for k, (x, desc) in enumerate(zip(inputs, group.inputs, strict=True)):
        wide = compute_dtype(desc.dtype)
        env[("in", k)] = x if wide == desc.dtype else o.cast(x, wide)
    run_steps(o, group.steps.nodes, env)
    res = group.result
    return o.cast(env[(res.kind, res.index)], group.output.dtype)
