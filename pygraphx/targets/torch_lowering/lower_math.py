"""Element-wise groups, reductions, softmax and matrix products, lowered to torch.

* `pointwise` (a fused group) and lone element-wise ops: one generated step (`pointwise.py`)
  writing the arena slot with `out=` and updating it in place; broadcast scalar constants
  become Python numbers in the code, whole activations (GELU, SiLU) one torch kernel.
* `fused_reduce`: the element-wise prologue into a scratch buffer, then the reduction with
  `out=` into the slot.
* `reduce_*`, `softmax`, `logsoftmax`, `argmax`/`argmin`: torch reductions with `out=`.
* `dot`: with a constant right-hand side (a weight, broadcast over the batch or not) the whole
  batch is one GEMM, on the CPU through MKL with the weight packed once at prepare
  (`mkl._mkl_linear`); otherwise `torch.matmul`. The product is a new tensor (not an arena
  slot, like the convolutions' results: see `conv_fusion.py`). A dot whose only user is an
  element-wise group takes that group's bias add into the GEMM, and the rest of the group
  (residual add, GELU) updates the product in place, which becomes the group's value. Half and
  bf16 products are computed in float32 and rounded once, as the reference does.

Declined (numpy fallback): integer and fp8 products and `quant_dot` (numpy's exact wrapping
arithmetic), integer means, products over several axes, empty max/min/mean reductions,
`argmax`/`argmin` with `select_last_index`, groups with types torch cannot compute in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops.fused import FusedReduce, PointwiseModule
from pygraphx.ops.pointwise import Pointwise
from pygraphx.ops.reduce import normalize_axes
from pygraphx.targets.torch_lowering.context import (
    CHANNELS_LAST,
    STANDARD,
    LoweringContext,
)
from pygraphx.targets.torch_lowering.dtypes import (
    COMPUTE_DTYPES,
    FLOAT_DTYPES,
    to_numpy,
    torch_dtype,
)
from pygraphx.targets.torch_lowering.lower import defer, deferred_producer, lowering, storing
from pygraphx.targets.torch_lowering.pointwise import (
    NotTraceable,
    Trace,
    Tracer,
    Value,
    collapse_activations,
    compile_group,
    peel_add,
    trace_body,
    traceable_dtypes,
)

Reducer = Callable[[torch.Tensor, torch.Tensor], Any]


# --- element-wise -----------------------------------------------------------------------------


def group_layout(ctx: LoweringContext, ins: Instruction, args: Sequence[int]) -> str:
    """Channels-last when a full (not broadcast) 4-D input is channels-last."""
    if ins.shape.ndim() != 4:
        return STANDARD
    for x, idx in zip(ins.inputs, args, strict=True):
        if ctx.layout[idx] == CHANNELS_LAST and not x.shape.broadcasted():
            return CHANNELS_LAST
    return STANDARD


def output_buffer(ctx: LoweringContext, ins: Instruction, layout: str) -> tuple[int, torch.Tensor]:
    """The slot `ins` writes (a private buffer when the memory plan has none for it)."""
    idx, out = ctx.output(ins, layout)
    if out is None:
        out = torch.empty(ins.shape.lens(), dtype=torch_dtype(ins.shape.dtype()), device=ctx.device)
        if layout == CHANNELS_LAST:
            out = out.contiguous(memory_format=torch.channels_last)
        ctx.env[idx] = out
        ctx.static[idx] = True
    return idx, out


def input_exprs(ctx: LoweringContext, args: Sequence[int], bindings: dict[str, Any]) -> list[str]:
    """Python expressions reading each input: a bound name when fixed, else `_env[i]`."""
    exprs = []
    bindings.setdefault("_env", ctx.env)
    for k, idx in enumerate(args):
        value = ctx.value(idx)
        if value is not None:
            name = f"_x{k}"
            bindings[name] = value
            exprs.append(name)
        else:
            exprs.append(f"_env[{idx}]")
    return exprs


def compile_into(
    ctx: LoweringContext,
    trace: Trace,
    result: Value,
    args: Sequence[int],
    out: torch.Tensor,
    scratch_base: int = 0,
    aliased_input: int | None = None,
    out_expr: str | None = None,
) -> Callable[[], None]:
    """Compile a traced group writing `out` (or, with `out_expr`, the tensor that expression
    reads at run time, shaped like `out`)."""
    bindings: dict[str, Any] = {}
    exprs = input_exprs(ctx, args, bindings)
    if aliased_input is not None:
        exprs[aliased_input] = "_out"
    scratch = ctx.scratch

    def get(k: int, dtype: torch.dtype) -> torch.Tensor:
        return scratch.get(scratch_base + k, out, dtype)

    compiled = compile_group(
        trace, result, exprs, out, get, bindings, aliased_input, out_expr, ctx.device
    )
    ctx.cache.setdefault("sources", []).append(compiled.source)
    return compiled.fn


def trace_group(
    body: Module, consts: dict[int, np.ndarray] | None = None
) -> tuple[Trace, Value] | None:
    try:
        trace, result = trace_body(body, consts=consts)
    except NotTraceable:
        return None
    if not traceable_dtypes(trace):
        return None
    return collapse_activations(trace, result)


def scalar_inputs(ctx: LoweringContext, ins: Instruction) -> dict[int, np.ndarray]:
    """Inputs of `ins` that are one constant number broadcast everywhere, by position."""
    found: dict[int, np.ndarray] = {}
    for k, x in enumerate(ins.inputs):
        idx = ctx.index.get(id(x))
        t = ctx.constant(idx) if idx is not None else None
        if t is None or t.numel() == 0 or not x.shape.scalar() or t.dtype not in COMPUTE_DTYPES:
            continue
        found[k] = to_numpy(t[(0,) * t.dim()].clone().reshape(1)).reshape(())
    return found


def trace_single(ins: Instruction) -> tuple[Trace, Value] | None:
    """The trace of one element-wise instruction (no fusion pass ran)."""
    trace = Trace([Value("in", i.shape.dtype(), index=k) for k, i in enumerate(ins.inputs)])
    try:
        result = ins.op.apply(Tracer(trace), *trace.inputs)
        if result.dtype != ins.shape.dtype():
            result = Tracer(trace).cast(result, ins.shape.dtype())
    except (NotTraceable, AttributeError, TypeError):
        return None
    return (trace, result) if traceable_dtypes(trace) else None


@lowering("pointwise")
def lower_pointwise(ctx: LoweringContext, ins: Instruction) -> bool:
    """A fused element-wise group: one generated step writing the slot in place."""
    traced = trace_group(ins.module_inputs[0], scalar_inputs(ctx, ins))
    if traced is None:
        return False
    args = ctx.args(ins)
    idx, out = output_buffer(ctx, ins, group_layout(ctx, ins, args))
    ctx.emit(compile_into(ctx, *traced, args, out), ins, idx)
    return True


def lower_single_pointwise(ctx: LoweringContext, ins: Instruction) -> bool:
    traced = trace_single(ins)
    if traced is None:
        return False
    args = ctx.args(ins)
    idx, out = output_buffer(ctx, ins, group_layout(ctx, ins, args))
    ctx.emit(compile_into(ctx, *traced, args, out), ins, idx)
    return True


def register_single_pointwise() -> None:
    from pygraphx.ops.base import OPS
    from pygraphx.targets.torch_lowering.lower import LOWERINGS

    for name, cls in OPS.items():
        if issubclass(cls, Pointwise) and name not in LOWERINGS:
            LOWERINGS[name] = lower_single_pointwise


register_single_pointwise()


@lowering("contiguous")
def lower_contiguous(ctx: LoweringContext, ins: Instruction) -> bool:
    x = ctx.arg(ins, 0)
    idx, out = output_buffer(ctx, ins, STANDARD)
    env = ctx.env

    def step() -> None:
        out.copy_(env[x])

    ctx.emit(step, ins, idx)
    return True


# --- reductions -----------------------------------------------------------------------------


def reducer(op: Any, src_lens: Sequence[int], dtype: torch.dtype) -> Reducer | None:
    """`f(x, out)` computing reduction `op` of `x` into `out`, or None (not handled)."""
    name = op.name
    rank = len(src_lens)
    is_float = dtype in FLOAT_DTYPES
    if name in ("softmax", "logsoftmax"):
        if not is_float:
            return None
        axis = op.axis + rank if op.axis < 0 else op.axis
        f = torch._softmax if name == "softmax" else torch._log_softmax
        return lambda x, out: f(x, axis, False, out=out)
    if name.startswith("reduce_"):
        axes = normalize_axes(op, op.axes, rank)
        empty = any(src_lens[a] == 0 for a in axes)
        if dtype == torch.bool or dtype not in _REDUCE_DTYPES:
            return None
        if name == "reduce_sum":
            return lambda x, out: torch.sum(x, axes, keepdim=True, dtype=out.dtype, out=out)
        if name == "reduce_mean":
            if not is_float or empty:
                return None
            return lambda x, out: torch.mean(x, axes, keepdim=True, out=out)
        if name in ("reduce_max", "reduce_min"):
            if empty:
                return None
            f = torch.amax if name == "reduce_max" else torch.amin
            return lambda x, out: f(x, axes, keepdim=True, out=out)
        if name == "reduce_prod":
            if len(axes) != 1:
                return None
            (a,) = axes
            return lambda x, out: torch.prod(x, a, keepdim=True, dtype=out.dtype, out=out)
        return None
    if name in ("argmax", "argmin"):
        if op.select_last_index or dtype == torch.bool:
            return None
        axis = op.axis + rank if op.axis < 0 else op.axis
        f = torch.argmax if name == "argmax" else torch.argmin
        return lambda x, out: f(x, axis, keepdim=True, out=out)
    return None


_REDUCE_DTYPES = frozenset(
    [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
     torch.int16, torch.int32, torch.int64]
)  # fmt: skip


@lowering(
    "softmax", "logsoftmax", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min",
    "reduce_prod", "argmax", "argmin",
)  # fmt: skip
def lower_reduce(ctx: LoweringContext, ins: Instruction) -> bool:
    src = ins.inputs[0].shape
    f = reducer(ins.op, src.lens(), torch_dtype(src.dtype()))
    if f is None:
        return False
    x = ctx.arg(ins, 0)
    idx, out = output_buffer(ctx, ins, STANDARD)
    env = ctx.env

    def step() -> None:
        f(env[x], out)

    ctx.emit(step, ins, idx)
    return True


@lowering("fused_reduce")
def lower_fused_reduce(ctx: LoweringContext, ins: Instruction) -> bool:
    """Element-wise prologue into scratch 0, then the reduction into the slot."""
    body = ins.module_inputs[0]
    red = body.get_returns()[0]
    if isinstance(red.op, Pointwise | FusedReduce | PointwiseModule) or red.is_param():
        return False
    src = red.inputs[0]
    f = reducer(red.op, src.shape.lens(), torch_dtype(src.shape.dtype()))
    if f is None or len(red.inputs) != 1:
        return False
    args = ctx.args(ins)
    env = ctx.env
    if src.is_param():
        x = args[body.get_parameters().index(src)]
        idx, out = output_buffer(ctx, ins, STANDARD)

        def step() -> None:
            f(env[x], out)

        ctx.emit(step, ins, idx)
        return True
    try:
        trace, result = trace_body(body, stop=red, consts=scalar_inputs(ctx, ins))
    except NotTraceable:
        return False
    if not traceable_dtypes(trace):
        return False
    trace, result = collapse_activations(trace, result)
    idx, out = output_buffer(ctx, ins, STANDARD)
    like = torch.empty(src.shape.lens(), dtype=torch_dtype(src.shape.dtype()), device="meta")
    tmp = ctx.scratch.get(0, like)
    prologue = compile_into(ctx, trace, result, args, tmp, scratch_base=1)

    def step_with_prologue() -> None:
        prologue()
        f(tmp, out)

    ctx.emit(step_with_prologue, ins, idx)
    return True


# --- matrix products ------------------------------------------------------------------------


def _batch_broadcast_matrix(ctx: LoweringContext, ins: Instruction, k: int) -> torch.Tensor | None:
    """Input k as one fixed 2-D matrix when it is the same matrix for every batch entry."""
    x = ins.inputs[k].shape
    t = ctx.constant(ctx.arg(ins, k))
    if t is None:
        return None
    if x.ndim() == 2:
        return t
    strides = x.strides()[:-2]
    if any(s != 0 for s, n in zip(strides, x.lens()[:-2], strict=True) if n != 1):
        return None
    return t[(0,) * (x.ndim() - 2)]


def _bias_vector(ctx: LoweringContext, x: Instruction, n: int) -> torch.Tensor | None:
    """A fixed float32 input that varies along its last axis only, as an (n,) vector."""
    t = ctx.constant(ctx.index[id(x)])
    if t is None or t.dtype != torch.float32 or t.dim() < 1 or t.shape[-1] != n:
        return None
    if any(s != 0 for s, m in zip(t.stride()[:-1], t.shape[:-1], strict=True) if m != 1):
        return None
    return t[(0,) * (t.dim() - 1)].contiguous()


def _packed_weight(ctx: LoweringContext, ins: Instruction, w: torch.Tensor, rows: int) -> Any:
    """MKL's packed form of the fixed (K, N) matrix `w` for `rows` x K inputs, made once."""
    key = ("mkl_weight", id(ins.inputs[1]), rows)
    if key not in ctx.cache:
        wt = w.t().contiguous()
        n, k = wt.shape
        packed = torch.ops.mkl._mkl_reorder_linear_weight(wt, rows)
        # the original weight is read only for other row counts, which static shapes rule out
        ctx.cache[key] = (packed, torch.zeros(1, dtype=wt.dtype).expand(n, k))
    return ctx.cache[key]


def _use_mkl(ctx: LoweringContext) -> bool:
    return (
        ctx.device.type == "cpu"
        and ctx.options.get("mkl_linear", True)
        and torch.backends.mkl.is_available()
    )


def dot_producer(
    ctx: LoweringContext, ins: Instruction, bias: torch.Tensor | None = None
) -> Callable[[], torch.Tensor] | None:
    """A closure returning the product as a new tensor (plus `bias` along the last axis), or
    None (declined: integer and fp8 types; a bias with a run-time right-hand side)."""
    a_shape = ins.inputs[0].shape
    dtype = torch_dtype(a_shape.dtype())
    if dtype not in (torch.float32, torch.float64):
        return None
    env = ctx.env
    a, b = ctx.args(ins)
    out_lens = tuple(ins.shape.lens())
    w = _batch_broadcast_matrix(ctx, ins, 1)
    if w is None:
        if bias is not None:
            return None
        mm = torch.matmul
        return lambda: mm(env[a], env[b])
    k, n = w.shape
    rows = ins.shape.elements() // n if n else 0
    if dtype == torch.float32 and _use_mkl(ctx) and rows > 0 and k > 0:
        packed, original = _packed_weight(ctx, ins, w, rows)
        linear = torch.ops.mkl._mkl_linear

        def run_mkl() -> torch.Tensor:
            return linear(env[a].reshape(rows, k), packed, original, bias, rows).view(out_lens)

        return run_mkl
    if bias is not None:
        addmm = torch.addmm
        return lambda: addmm(bias, env[a].reshape(rows, k), w).view(out_lens)
    mm = torch.matmul
    return lambda: mm(env[a], w)


@lowering("dot")
def lower_dot(ctx: LoweringContext, ins: Instruction) -> bool:
    dtype = torch_dtype(ins.shape.dtype())
    if dtype in (torch.float16, torch.bfloat16):
        return _lower_low_precision_dot(ctx, ins)
    produce = dot_producer(ctx, ins)
    if produce is None:
        return False
    user = ins.outputs[0] if len(ins.outputs) == 1 else None
    if user is not None and _epilogue_ok(ins, user) and defer(ctx, ins, user, _fuse_dot):
        return True
    idx = ctx.bind_dynamic(ins)
    ctx.mark_fresh(idx)
    env = ctx.env

    def step() -> None:
        env[idx] = produce()

    ctx.emit(step, ins, idx)
    return True


def _lower_low_precision_dot(ctx: LoweringContext, ins: Instruction) -> bool:
    """half / bf16: accumulate in float32 and round once, as the reference does."""
    env = ctx.env
    a, b = ctx.args(ins)
    idx, out = output_buffer(ctx, ins, STANDARD)
    mm = torch.matmul

    def step() -> None:
        out.copy_(mm(env[a].float(), env[b].float()))

    ctx.emit(step, ins, idx)
    return True


def _epilogue_ok(producer: Instruction, user: Instruction) -> bool:
    return (
        user.op.name == "pointwise"
        and user.shape.type() == producer.shape.type()
        and user.shape.lens() == producer.shape.lens()
        and trace_group(user.module_inputs[0]) is not None
        and sum(1 for i in user.inputs if i is producer) == 1
    )


def _fuse_dot(ctx: LoweringContext, user: Instruction) -> bool:
    """dot -> its element-wise user: a bias add in the group goes into the GEMM, and the rest
    of the group updates the product in place, which becomes the group's value (profiling
    runs the dot and the group as separate steps)."""
    dot = deferred_producer(ctx, user)
    saved, ctx.steps = ctx.steps, []
    lower_dot_alone(ctx, dot)
    lower_pointwise(ctx, user)
    unfused, ctx.steps = ctx.steps, saved
    traced = trace_group(user.module_inputs[0], scalar_inputs(ctx, user))
    assert traced is not None
    trace, result = traced
    k = user.inputs.index(dot)
    n = dot.shape.lens()[-1] if dot.shape.ndim() else 0
    biases = {
        j for j, x in enumerate(user.inputs) if x is not dot and _bias_vector(ctx, x, n) is not None
    }
    bias = None
    peeled = peel_add(trace, result, k, biases)
    if peeled is not None:
        candidate = _bias_vector(ctx, user.inputs[peeled[2]], n)
        if dot_producer(ctx, dot, candidate) is not None:
            trace, result, bias = peeled[0], peeled[1], candidate
    produce = dot_producer(ctx, dot, bias)
    assert produce is not None
    uidx = ctx.index[id(user)]
    if ctx.static[uidx]:
        # the profiling steps store the group's value at its index like the fused step does
        unfused[-1].fn = storing(unfused[-1].fn, ctx.env, uidx, ctx.env[uidx])
    ctx.static[uidx] = False
    ctx.mark_fresh(uidx)
    env = ctx.env
    if result.kind == "in" and result.index == k:  # the group was the bias add alone

        def step() -> None:
            env[uidx] = produce()

    else:
        like = torch.empty(user.shape.lens(), dtype=torch_dtype(user.shape.dtype()), device="meta")
        group = compile_into(
            ctx, trace, result, ctx.args(user), like, aliased_input=k, out_expr=f"_env[{uidx}]"
        )

        def step() -> None:
            env[uidx] = produce()
            group()

    ctx.emit(step, [dot, user], uidx, unfused)
    return True


def lower_dot_alone(ctx: LoweringContext, ins: Instruction) -> None:
    produce = dot_producer(ctx, ins)
    assert produce is not None
    idx = ctx.bind_dynamic(ins)
    ctx.mark_fresh(idx)
    env = ctx.env

    def step() -> None:
        env[idx] = produce()

    ctx.emit(step, ins, idx)
