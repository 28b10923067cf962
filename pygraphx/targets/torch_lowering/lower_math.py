"""Element-wise groups, reductions and softmax, lowered to torch (`dot` is in `lower_gemm.py`).

* `pointwise` (a fused group) and lone element-wise ops: one generated step (`pointwise.py`)
  writing the arena slot with `out=` and updating it in place; broadcast scalar constants
  become Python numbers in the code, whole activations (GELU, SiLU) one torch kernel.
* `fused_reduce`: the element-wise prologue into a scratch buffer, then the reduction with
  `out=` into the slot.
* `reduce_*`, `softmax`, `logsoftmax`, `argmax`/`argmin`: torch reductions with `out=`.

Declined (numpy fallback): integer means, products over several axes, empty max/min/mean reductions,
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
from pygraphx.targets.torch_lowering.input_convert import lower_input_convert
from pygraphx.targets.torch_lowering.pointwise import (
    NotTraceable,
    Trace,
    Tracer,
    Value,
    compile_group,
    trace_body,
    traceable_dtypes,
)
from pygraphx.targets.torch_lowering.registry import LOWERINGS, lowering

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
    ctx.sources.append(compiled.source)
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
    return trace, result


def scalar_inputs(ctx: LoweringContext, ins: Instruction) -> dict[int, np.ndarray]:
    """Inputs of `ins` that are one constant number broadcast everywhere, by position."""
    found: dict[int, np.ndarray] = {}
    for k, x in enumerate(ins.inputs):
        idx = ctx.index.get(id(x))
        t = ctx.constant(idx) if idx is not None else None
        if t is None or t.numel() == 0 or not x.shape.scalar() or t.dtype not in COMPUTE_DTYPES:
            continue
        found[k] = to_numpy(t[(0,) * t.dim()].reshape(1).cpu().clone()).reshape(())
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
    """A fused element-wise group: one generated step writing the slot in place (a lone
    float32 -> bf16 convert feeding convolutions: one oneDNN reorder, `input_convert`)."""
    if lower_input_convert(ctx, ins):
        return True
    return _emit_traced(ctx, ins, trace_group(ins.module_inputs[0], scalar_inputs(ctx, ins)))


def lower_single_pointwise(ctx: LoweringContext, ins: Instruction) -> bool:
    """One element-wise instruction, as a group of one."""
    if ins.op.name == "convert" and lower_input_convert(ctx, ins):
        return True
    return _emit_traced(ctx, ins, trace_single(ins))


def _emit_traced(ctx: LoweringContext, ins: Instruction, traced: tuple[Any, Any] | None) -> bool:
    """The generated step of a traced group (False when it could not be traced)."""
    if traced is None:
        return False
    args = ctx.args(ins)
    idx, out = output_buffer(ctx, ins, group_layout(ctx, ins, args))
    ctx.emit(compile_into(ctx, *traced, args, out), ins, idx)
    return True


def register_single_pointwise() -> None:
    from pygraphx.ops.base import OPS

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
    idx, out = output_buffer(ctx, ins, STANDARD)
    like = torch.empty(src.shape.lens(), dtype=torch_dtype(src.shape.dtype()), device="meta")
    tmp = ctx.scratch.get(0, like)
    prologue = compile_into(ctx, trace, result, args, tmp, scratch_base=1)

    def step_with_prologue() -> None:
        prologue()
        f(tmp, out)

    ctx.emit(step_with_prologue, ins, idx)
    return True
