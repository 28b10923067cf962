"""ONNX control flow: If, Loop and Scan, with their sub-graphs parsed into program sub-modules.

Sub-modules are named as in MIGraphX, after the module that holds the node: `main:if0_then`,
`main:if0_else`, `main:loop0_body`, `main:loop0_body:scan0_body`, ...; their nodes read outer
values by name (the parser's `outer` map). See ops/control.py for the operators.

If: with a compile-time condition only the taken branch is parsed, straight into the current
module (so the branches may differ in anything). Otherwise both branches become sub-modules and
must give the same shapes and types; sequence and optional outputs are allowed when both
branches give the same structure (sequence lengths, optional presence).

Loop: the loop-carried values keep their shapes (a static IR). Scan outputs get a static length:
  1. the exact trip count when it is known at compile time: a constant max trip count M and a
     condition that is constant or computed from the iteration number and constants only;
  2. else the length the model declares for the output (graph outputs, value_info);
  3. else M when it is a constant (at most 2**20);
  4. else the parse option `max_loop_iterations` (default 10).
A run that stops early leaves zero rows at the end (MIGraphX's behaviour); one that would need
more rows fails at run time with an error naming `max_loop_iterations`. A loop that carries
sequences or optionals, or whose carried values change shape, is unrolled at parse time when its
trip count is known at compile time, and refused otherwise.

Scan: opset 8 (batch axis, `directions`, constant `sequence_lens`) and opset 9+
(`scan_input_axes/directions`, `scan_output_axes/directions`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ir.shape import Shape
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.errors import OnnxParseError
from pygraphx.onnx.handlers.sequence import (
    Value,
    describe,
    flatten_values,
    takes_sequences,
    unflatten_values,
)
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops.control import If, Loop, Scan
from pygraphx.ops.copy_ops import Concat
from pygraphx.ops.layout import Unsqueeze

Args = list[Value | None]

#: M above this is not used as the static length of scan outputs (it stands for "unbounded")
_MAX_STATIC_TRIP = 1 << 20
#: how many iterations the compile-time trip-count analysis simulates
_MAX_SIMULATED = 1 << 16
#: how many iterations a loop may be unrolled at parse time
_MAX_UNROLL = 1024


def _tensor(ctx: NodeContext, v: Value | None, what: str) -> Instruction:
    if isinstance(v, Instruction):
        return v
    raise ctx.error(f"{what} must be a tensor, got {describe(v)}")


def _label(ctx: NodeContext, attr: str) -> str:
    return f"{attr} of {ctx.describe()}"


def _single(ctx: NodeContext, ins: Instruction, type_name: str, what: str) -> None:
    if ins.shape.type() != type_name or ins.shape.elements() != 1:
        raise ctx.error(f"{what} must be one {type_name} value, got {ins.shape}")


def _const_scalar(ctx: NodeContext, ins: Instruction | None) -> np.generic | None:
    if ins is None:
        return None
    value = ctx.const(ins)
    return None if value is None else np.asarray(value).reshape(-1)[0]


def _declared_shape(vi: onnx.ValueInfoProto, type_name: str) -> Shape:
    """A one-element shape for a loop's iteration number or condition: the body's declared
    lens when they are static and hold one element, else a scalar."""
    tt = vi.type.tensor_type
    if vi.type.HasField("tensor_type") and tt.HasField("shape"):
        dims = tt.shape.dim
        if all(d.HasField("dim_value") and d.dim_value == 1 for d in dims):
            return Shape(type_name, [1] * len(dims))
    return Shape(type_name, [])


def _same(a: Instruction, b: Instruction) -> bool:
    return a.shape.lens() == b.shape.lens() and a.shape.type() == b.shape.type()


def _add_outputs(
    ctx: NodeContext, make: Callable[[int], Instruction], count: int
) -> list[Instruction | None]:
    """One instruction per named node output (unnamed ones are not built)."""
    names = list(ctx.node.output)
    return [make(k) if k < len(names) and names[k] else None for k in range(count)]


# --- If ---------------------------------------------------------------------------------------


@onnx_op("If")
@takes_sequences
def parse_if(ctx: NodeContext, args: Args) -> list[Value]:
    cond = _tensor(ctx, args[0] if args else None, "the condition")
    _single(ctx, cond, "bool_type", "the condition")
    parser = ctx.parser
    outer = parser.scope_values()
    branches = {"then_branch": ctx.attr("then_branch"), "else_branch": ctx.attr("else_branch")}
    for attr, g in branches.items():
        if len(g.input):
            raise ctx.error(f"{attr} declares {len(g.input)} input(s); If branches take none")
    known = _const_scalar(ctx, cond)
    if known is not None:
        # a compile-time condition: the taken branch is the program (MIGraphX does the same)
        attr = "then_branch" if bool(known) else "else_branch"
        return parser.parse_subgraph(branches[attr], ctx.module, outer, label=_label(ctx, attr))
    k = parser.next_index(ctx.module, "if")
    mods: list[Module] = []
    parsed = []
    for attr, suffix in (("then_branch", "then"), ("else_branch", "else")):
        mod = parser.new_module(ctx.module, f"if{k}_{suffix}")
        mods.append(mod)
        values = parser.parse_subgraph(branches[attr], mod, outer, label=_label(ctx, attr))
        parsed.append((values, *flatten_values(values)))
    (then_vals, then_struct, then_flat), (_, else_struct, else_flat) = parsed
    if then_struct != else_struct:
        raise ctx.error(
            "the branches give different kinds of values (then: "
            f"{', '.join(describe(v) for v in then_vals)}; else: "
            f"{', '.join(describe(v) for v in parsed[1][0])}) and the condition is a run-time "
            "value: a static IR needs both branches to give the same"
        )
    for j, (a, b) in enumerate(zip(then_flat, else_flat, strict=True)):
        if not _same(a, b):
            raise ctx.error(
                f"output {j}: then_branch gives {a.shape.type()} {a.shape.lens()}, else_branch "
                f"gives {b.shape.type()} {b.shape.lens()}, and the condition is a run-time value: "
                "a static IR needs both branches to give the same shapes"
            )
    for mod, flat in zip(mods, (then_flat, else_flat), strict=True):
        parser.finish_module(mod, flat)
    captured = parser.captured(mods)
    outs = [
        ctx.module.add_instruction(If(output=j), [cond, *captured], mods)
        for j in range(len(then_flat))
    ]
    return unflatten_values(then_struct, iter(outs), then_vals)


# --- Loop -------------------------------------------------------------------------------------


def _trip_count(
    ctx: NodeContext, body: Module, trip: int | None, has_trip: bool, cond0: bool | None
) -> int | None:
    """The exact number of iterations when it is known at compile time, else None."""
    if cond0 is None:
        return None
    if not cond0:
        return 0
    if has_trip and trip is None:
        return None  # M is a run-time value
    params = body.get_parameters()
    iter_p, cond_p = params[0], params[1]
    cond_out = body.get_returns()[0]
    const = ctx.parser.const_value

    def depends(ins: Instruction) -> set[int]:
        seen: set[int] = set()
        stack = [ins]
        while stack:
            i = stack.pop()
            if id(i) in seen or i.module is not body:
                continue
            seen.add(id(i))
            stack.extend(i.inputs)
        return seen

    deps = depends(cond_out)
    if any(id(p) in deps for p in params[2:]):
        return None  # the condition reads loop-carried (run-time) values

    def evaluate(env: dict[int, np.ndarray]) -> bool | None:
        memo: dict[int, np.ndarray | None] = dict(env)

        def ev(ins: Instruction) -> np.ndarray | None:
            if id(ins) in memo:
                return memo[id(ins)]
            if ins.module is not body:
                value = const(ins)
            elif ins.is_literal():
                value = ins.get_literal().array
            elif ins.is_param() or ins.module_inputs or ins.op.name == "unknown":
                value = None
            else:
                xs = [ev(i) for i in ins.inputs]
                value = None if any(x is None for x in xs) else ins.op.compute(ins.shape, xs)
            memo[id(ins)] = value
            return value

        value = ev(cond_out)
        return None if value is None else bool(np.asarray(value).reshape(-1)[0])

    def bind(i: int, c: bool) -> dict[int, np.ndarray]:
        return {
            id(iter_p): np.full(iter_p.shape.lens(), i, dtype=np.int64),
            id(cond_p): np.full(cond_p.shape.lens(), c, dtype=np.bool_),
        }

    if id(iter_p) not in deps:
        # the condition is a function of the previous condition only
        stays = evaluate(bind(0, True))
        if stays is None:
            return None
        if not stays:
            return min(1, trip) if has_trip else 1
        return trip if has_trip else None
    limit = trip if has_trip else _MAX_SIMULATED
    if limit > _MAX_SIMULATED:
        return None
    i, c = 0, True
    while c and i < limit:
        nxt = evaluate(bind(i, c))
        if nxt is None:
            return None
        c, i = nxt, i + 1
    if c and not has_trip:
        return None
    return i


def _probe_shapes(
    ctx: NodeContext, body_g: onnx.GraphProto, shapes: Sequence[Shape], idx: int
) -> bool:
    """Parse the body once with the iteration number 0 and condition true (compile-time
    values) and declare the shapes it gives to every value whose shape the model leaves open.

    Shapes in a static IR are the same in every iteration; run-time ops that take a shape from
    a declaration (dynamic_slice, shape_guard, ...) check it on each iteration. Returns False
    when the probe does not parse either (the original error is then the one to report)."""
    parser = ctx.parser
    probe = parser.new_module(ctx.module, f"loop{idx}_probe")
    bound: list[Value] = [
        probe.add_literal(np.zeros(shapes[0].lens(), dtype=np.int64)),
        probe.add_literal(np.ones(shapes[1].lens(), dtype=np.bool_)),
    ]
    bound += [probe.add_parameter(f"v{j}", s) for j, s in enumerate(shapes[2:])]
    names: dict[str, Value] = {}
    try:
        parser.parse_subgraph(
            body_g,
            probe,
            parser.scope_values(),
            label=f"{_label(ctx, 'body')} (shape probe at iteration 0)",
            inputs=bound,
            names=names,
        )
    except OnnxParseError:
        return False
    finally:
        parser.discard_module(probe)
    declared = 0
    for node in body_g.node:
        for name in node.output:
            v = names.get(name)
            if name and isinstance(v, Instruction) and not parser.has_static_shape(name):
                parser.declare_shape(name, v.shape)
                declared += 1
    return declared > 0


def _carried_problem(outs: Sequence[Value], shapes: Sequence[Shape], n: int, k: int) -> str | None:
    if len(outs) != 1 + n + k:
        return f"the body gives {len(outs)} outputs, expected {1 + n + k}"
    for j, v in enumerate(outs):
        if not isinstance(v, Instruction):
            return f"body output {j} is {describe(v)}, not a tensor"
    for j in range(n):
        got, want = outs[1 + j].shape, shapes[2 + j]  # type: ignore[union-attr]
        if got.lens() != want.lens() or got.type() != want.type():
            return (
                f"loop-carried value {j} changes from {want.type()} {want.lens()} to "
                f"{got.type()} {got.lens()} in one iteration"
            )
    return None


def _parse_loop_body(
    ctx: NodeContext,
    body_g: onnx.GraphProto,
    shapes: list[Shape],
    outer: dict[str, Value],
    idx: int,
) -> tuple[Module, list[Value]]:
    """The Loop body parsed into a new module, with the iteration-0 shapes as a second try."""
    parser = ctx.parser
    body = parser.new_module(ctx.module, f"loop{idx}_body")
    try:
        outs = parser.parse_subgraph(
            body_g, body, outer, label=_label(ctx, "body"), input_shapes=shapes
        )
    except OnnxParseError:
        # a shape computed from the iteration number (a Slice at `iter`, say): take the
        # shapes the body has at iteration 0 as its declared ones and parse again
        parser.discard_module(body)
        if not _probe_shapes(ctx, body_g, shapes, idx):
            raise
        body = parser.new_module(ctx.module, f"loop{idx}_body")
        outs = parser.parse_subgraph(
            body_g, body, outer, label=_label(ctx, "body"), input_shapes=shapes
        )
    return body, outs


def _scan_length(
    ctx: NodeContext,
    body: Module,
    trip: int | None,
    has_trip: bool,
    cond0: bool | None,
    n: int,
    k: int,
) -> int:
    """The static length of the scan outputs: exact trip count, declared, M, or the option."""
    exact = _trip_count(ctx, body, trip, has_trip, cond0)
    declared = [lens[0] for j in range(n, n + k) if (lens := ctx.declared_lens(j))]
    if exact is not None and exact <= _MAX_STATIC_TRIP:
        return exact
    if declared:
        return declared[0]
    if trip is not None and trip <= _MAX_STATIC_TRIP:
        return trip
    return int(ctx.parser.options["max_loop_iterations"])


@onnx_op("Loop")
@takes_sequences
def parse_loop(ctx: NodeContext, args: Args) -> list[Value | None]:
    body_g = ctx.attr("body")
    args = list(args) + [None] * max(0, 2 - len(args))
    m_ins = None if args[0] is None else _tensor(ctx, args[0], "the trip count M")
    c_ins = None if args[1] is None else _tensor(ctx, args[1], "the condition")
    inits = args[2:]
    n = len(inits)
    k = len(body_g.output) - 1 - n
    if len(body_g.input) != 2 + n or k < 0:
        raise ctx.error(
            f"the body takes {len(body_g.input)} inputs and gives {len(body_g.output)} outputs; "
            f"with {n} loop-carried value(s) it must take {2 + n} and give at least {1 + n}"
        )
    if any(v is None for v in inits):
        raise ctx.error("loop-carried initial values cannot be omitted")
    if m_ins is not None:
        _single(ctx, m_ins, "int64_type", "the trip count M")
    if c_ins is not None:
        _single(ctx, c_ins, "bool_type", "the condition")
    trip_value = _const_scalar(ctx, m_ins)
    trip = None if trip_value is None else max(int(trip_value), 0)
    cond_value = True if c_ins is None else _const_scalar(ctx, c_ins)
    cond0 = None if cond_value is None else bool(cond_value)
    parser = ctx.parser
    outer = parser.scope_values()

    if not all(isinstance(v, Instruction) for v in inits):
        why = "it carries " + ", ".join(
            describe(v) for v in inits if not isinstance(v, Instruction)
        )
        return _unroll(ctx, body_g, m_ins, trip, cond0, inits, k, why)

    idx = parser.next_index(ctx.module, "loop")
    shapes = [
        _declared_shape(body_g.input[0], "int64_type"),
        _declared_shape(body_g.input[1], "bool_type"),
    ] + [Shape(v.shape.type(), v.shape.lens()) for v in inits]  # type: ignore[union-attr]
    body, outs = _parse_loop_body(ctx, body_g, shapes, outer, idx)
    problem = _carried_problem(outs, shapes, n, k)
    if problem is None:
        cond_out = outs[0]
        assert isinstance(cond_out, Instruction)
        if cond_out.shape.type() != "bool_type" or cond_out.shape.elements() != 1:
            problem = f"the body's condition output is {cond_out.shape}, not one bool"
    if problem is not None:
        parser.discard_module(body)
        return _unroll(ctx, body_g, m_ins, trip, cond0, inits, k, problem)
    parser.finish_module(body, outs)  # type: ignore[arg-type]

    length = _scan_length(ctx, body, trip, m_ins is not None, cond0, n, k) if k else 0
    if m_ins is None:
        m_ins = ctx.literal(np.array(np.iinfo(np.int64).max, dtype=np.int64))
    if c_ins is None:
        c_ins = ctx.literal(np.array(True))
    captured = parser.captured([body])
    inputs = [m_ins, c_ins, *inits, *captured]
    return _add_outputs(
        ctx,
        lambda j: ctx.module.add_instruction(Loop(length, j), inputs, [body]),
        n + k,
    )


def _unroll(
    ctx: NodeContext,
    body_g: onnx.GraphProto,
    m_ins: Instruction | None,
    trip: int | None,
    cond0: bool | None,
    inits: Sequence[Value | None],
    k: int,
    why: str,
) -> list[Value | None]:
    """Inline the body once per iteration (the trip count must be known at compile time)."""
    if m_ins is not None and trip is None:
        raise ctx.error(
            f"{why}: a static IR can only run such a loop unrolled at compile time, and the "
            "trip count M is a run-time value"
        )
    if cond0 is None:
        raise ctx.error(
            f"{why}: a static IR can only run such a loop unrolled at compile time, and the "
            "initial condition is a run-time value"
        )
    n = len(inits)
    carried = list(inits)
    scans: list[list[Instruction]] = [[] for _ in range(k)]
    i, cond = 0, cond0
    while cond and (trip is None or i < trip):
        if i >= _MAX_UNROLL:
            raise ctx.error(f"{why}: unrolling it would take more than {_MAX_UNROLL} iterations")
        bound = [
            ctx.literal(np.array(i, dtype=np.int64)),
            ctx.literal(np.array(cond, dtype=np.bool_)),
            *carried,
        ]
        outs = ctx.inline(body_g, bound, f"{_label(ctx, 'body')} (unrolled, iteration {i})")
        c = _const_scalar(ctx, _tensor(ctx, outs[0], "the body's condition output"))
        if c is None:
            raise ctx.error(
                f"{why}: unrolling it needs the condition at compile time, and iteration {i} "
                "computes it from run-time values"
            )
        cond = bool(c)
        carried = list(outs[1 : 1 + n])
        for acc, v in zip(scans, outs[1 + n :], strict=True):
            acc.append(_tensor(ctx, v, "a scan output"))
        i += 1
    stacked: list[Value | None] = []
    for j, acc in enumerate(scans):
        if not acc:
            raise ctx.error(
                f"{why}: unrolled, it runs no iteration, so the element shape of scan output {j} "
                "is unknown"
            )
        if any(not _same(a, acc[0]) for a in acc):
            raise ctx.error(f"scan output {j} changes shape between iterations")
        rows = [ctx.add(Unsqueeze((0,)), a) for a in acc]
        stacked.append(rows[0] if len(rows) == 1 else ctx.add(Concat(0), *rows))
    return carried + stacked


# --- Scan -------------------------------------------------------------------------------------


def _scan(
    ctx: NodeContext,
    states: list[Instruction],
    xs: list[Instruction],
    param_shapes: list[Shape],
    fields: dict,
) -> list[Instruction | None]:
    body_g = ctx.attr("body")
    n, m = len(states), len(xs)
    if len(body_g.input) != n + m:
        raise ctx.error(
            f"the body takes {len(body_g.input)} inputs, expected {n} state(s) + {m} scan input(s)"
        )
    k = len(body_g.output) - n
    if k < 0:
        raise ctx.error(f"the body gives {len(body_g.output)} outputs, fewer than {n} states")
    parser = ctx.parser
    idx = parser.next_index(ctx.module, "scan")
    body = parser.new_module(ctx.module, f"scan{idx}_body")
    outs = parser.parse_subgraph(
        body_g, body, parser.scope_values(), label=_label(ctx, "body"), input_shapes=param_shapes
    )
    flat = [_tensor(ctx, v, f"body output {j}") for j, v in enumerate(outs)]
    for j in range(n):
        got, want = flat[j].shape, param_shapes[j]
        if got.lens() != want.lens() or got.type() != want.type():
            raise ctx.error(
                f"state {j} changes from {want.type()} {want.lens()} to {got.type()} "
                f"{got.lens()} in one iteration; a static IR needs it to keep its shape"
            )
    out_axes = fields.get("scan_output_axes", (0,) * k)
    if len(out_axes) != k:
        raise ctx.error(f"scan_output_axes has {len(out_axes)} entries for {k} scan outputs")
    norm_axes = []
    for a, v in zip(out_axes, flat[n:], strict=True):
        r = v.shape.ndim() + 1
        if not -r <= a < r:
            raise ctx.error(f"scan output axis {a} is out of range for rank {r}")
        norm_axes.append(a + r if a < 0 else a)
    fields = {"scan_output_directions": (0,) * k, **fields, "scan_output_axes": tuple(norm_axes)}
    for name, count in (("scan_input_directions", m), ("scan_output_directions", k)):
        if len(fields[name]) != count:
            raise ctx.error(f"{name} has {len(fields[name])} entries, expected {count}")
    parser.finish_module(body, flat)
    captured = parser.captured([body])
    inputs = [*states, *xs, *captured]
    return _add_outputs(
        ctx,
        lambda j: ctx.module.add_instruction(
            Scan(num_scan_inputs=m, output=j, **fields), inputs, [body]
        ),
        n + k,
    )


def _scan_args(ctx: NodeContext, args: Args) -> tuple[list[Instruction], list[Instruction], int]:
    m = ctx.attr("num_scan_inputs")
    vals = [_tensor(ctx, a, f"input {j}") for j, a in enumerate(args)]
    if not 1 <= m <= len(vals):
        raise ctx.error(f"num_scan_inputs {m} does not fit {len(vals)} inputs")
    return vals[: len(vals) - m], vals[len(vals) - m :], m


@onnx_op("Scan", since=8)
@takes_sequences
def parse_scan8(ctx: NodeContext, args: Args) -> list[Instruction | None]:
    """Scan-8: every input and output has a leading batch axis; the sequence axis is 1."""
    seq_lens = args[0] if args else None
    states, xs, m = _scan_args(ctx, list(args[1:]))
    batch = (states + xs)[0].shape.lens()[0] if states + xs else 0
    for x in states + xs:
        if x.shape.ndim() < (2 if x in xs else 1) or x.shape.lens()[0] != batch:
            raise ctx.error(f"input {x.shape} lacks the batch axis of length {batch}")
    length = xs[0].shape.lens()[1]
    if seq_lens is not None:
        lens = np.asarray(
            ctx.require_const(_tensor(ctx, seq_lens, "sequence_lens"), "sequence_lens")
        )
        if np.any(lens != length):
            raise ctx.error(
                f"sequence_lens {lens.tolist()} differ from the sequence length {length}: "
                "per-batch lengths are not supported"
            )
    directions = tuple(ctx.attr("directions", (0,) * m))
    shapes = [Shape(s.shape.type(), s.shape.lens()[1:]) for s in states]
    shapes += [Shape(x.shape.type(), x.shape.lens()[2:]) for x in xs]
    fields = {
        "scan_input_axes": (0,) * m,
        "scan_input_directions": directions,
        "batched": True,
    }
    return _scan(ctx, states, xs, shapes, fields)


@onnx_op("Scan", since=9)
@takes_sequences
def parse_scan9(ctx: NodeContext, args: Args) -> list[Instruction | None]:
    states, xs, m = _scan_args(ctx, args)
    in_axes = tuple(ctx.attr("scan_input_axes", (0,) * m))
    if len(in_axes) != m:
        raise ctx.error(f"scan_input_axes has {len(in_axes)} entries for {m} scan inputs")
    norm = []
    for a, x in zip(in_axes, xs, strict=True):
        r = x.shape.ndim()
        if not -r <= a < r:
            raise ctx.error(f"scan input axis {a} is out of range for rank {r}")
        norm.append(a + r if a < 0 else a)
    lengths = {x.shape.lens()[a] for a, x in zip(norm, xs, strict=True)}
    if len(lengths) > 1:
        raise ctx.error(f"scan inputs have different sequence lengths {sorted(lengths)}")
    shapes = [Shape(s.shape.type(), s.shape.lens()) for s in states]
    for a, x in zip(norm, xs, strict=True):
        lens = x.shape.lens()
        del lens[a]
        shapes.append(Shape(x.shape.type(), lens))
    fields: dict = {
        "scan_input_axes": tuple(norm),
        "scan_input_directions": tuple(ctx.attr("scan_input_directions", (0,) * m)),
    }
    for name in ("scan_output_axes", "scan_output_directions"):
        if ctx.has_attr(name):
            fields[name] = tuple(ctx.attr(name))
    return _scan(ctx, states, xs, shapes, fields)
