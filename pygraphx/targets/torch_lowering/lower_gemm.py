"""Matrix products lowered to torch: `dot`, with its bias and element-wise epilogue.

With a constant right-hand side (a weight, broadcast over the batch or not) the whole batch is
one GEMM, on the CPU through oneDNN with the weight reordered once at prepare (its matmul
primitive through the C API, `onednn_linear.Linear`, where that library is loaded, else torch's
`mkldnn._linear_pointwise`; either applies a GELU / SiLU epilogue inside the GEMM), through
MKL with the weight packed once (`mkl._mkl_linear`), or `torch.addmm`, as `gemm_select.py`
chooses (the weights, packing and kernels are `gemm_kernels.py`; oneDNN unless `PGX_CPU_GEMM`
asks for another or for measuring, `addmm` for a one-row product; oneDNN alone for a product
with an epilogue; `mkldnn=False` / `mkl_linear=False` remove a candidate); otherwise
`torch.matmul`. Measured (CPU time per call, one thread, an AMD EPYC with AVX-512, torch 2.13)
on BERT-base's shapes (128 x 768 x {768, 2304, 3072}, 128 x 3072 x 768): oneDNN 100-107 GFLOP/s
against MKL's 84-94; a GELU after the GEMM costs 2% inside oneDNN, 3-10% as a separate pass. The
product is a new tensor (not an arena slot, like the convolutions' results: see `conv_fusion.py`),
so lowering one calls `malloc_keep.keep_freed_memory` as they do: GPT-2's (128, 50257) float32
logits at batch 1 (25.7 MB) otherwise came back as 4,391 fresh pages every run (one thread, the
2-core EPYC, two processes each way: 319-321 ms of CPU a run against 308-312 with the freed block
reused; at batch 8 some 50,000 faults a run, 2494 ms against 2376, bf16 1336 against 1262;
`benchmarks/bertb1_faults.py`). A dot whose only user is an element-wise group takes that
group's bias add into the GEMM, and the rest of the group (residual add, GELU) updates the product
in place, which becomes the group's value (a group that only adds a residual it may overwrite:
the product accumulates into it, `gemm_residual.py`; oneDNN's binary post-op,
`_linear_pointwise.binary(..., "add")`, was no faster than that in-place add: BERT-base's 12 layers
of GEMMs at batch 1, one thread, 213 ms against 212). bf16 products on a CPU with bf16 instructions
(`bf16_gemm`) run in bf16 through oneDNN the same way, with the weight packed once in bf16
(accumulated in float32 and rounded once, as the reference does; a fused bias and activation are
applied before that one rounding). A
bf16 product whose element-wise user is float32 (`quantize_bf16`'s default keeps a residual sum in
float32) takes the group's bias add into the GEMM and the rest of the group writes the float32
result, as one step (`_emit_widening`), or, where the group is only that residual sum, accumulates
in float32 into the residual (`gemm_residual.widened_residual_sum`); a large one that is only
converted to float32 (a language model's logits) runs in column blocks, each converted while in
cache (`_emit_widened_blocks`). A float32 product whose group is `gelu_tanh` or `gelu` (erf)
takes GELU as a native pass over its result (`native_gelu.py`) instead of oneDNN's post-op; a
bf16 one whose group is `gelu` may be written in float32, the pass rounding GELU to bf16 once
(`gemm_gelu.native_gelu_bf16`). Other half and bf16 products are computed in float32 and rounded once. A
float32 or bf16 product (with its bias add) that
slices only cut into column parts, a fused Q / K / V projection, runs as one product per part
(parts of equal width: one batched product), each written dense for the attention that reads it
(`_column_parts`, `_batched_parts`).

Declined (numpy fallback): integer and fp8 products and `quant_dot` (numpy's exact wrapping
arithmetic).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering import gemm_gelu, gemm_select, native_gelu
from pygraphx.targets.torch_lowering.context import STANDARD, LoweringContext, Step
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.gemm_kernels import (
    DNNL_EPILOGUES,
    GEMM_DTYPES,
    ClassifierKernel,
    batch_broadcast_matrix,
    bf16_gemm,
    bias_vector,
    dnnl_kernel,
    dnnl_parts_kernel,
    fast_kernel,
    use_dnnl,
    wide_parts_kernel,
)
from pygraphx.targets.torch_lowering.gemm_residual import (
    emit_residual_sum,
    residual_sum,
    widened_residual_sum,
)
from pygraphx.targets.torch_lowering.lower_math import (
    compile_into,
    lower_pointwise,
    output_buffer,
    scalar_inputs,
    trace_group,
)
from pygraphx.targets.torch_lowering.lower_views import view_chain, view_step
from pygraphx.targets.torch_lowering.malloc_keep import keep_freed_memory
from pygraphx.targets.torch_lowering.pointwise import peel_add
from pygraphx.targets.torch_lowering.registry import defer, deferred_producer, lowering, storing

# --- matrix products ------------------------------------------------------------------------


#: (bias, product) types a GEMM takes besides equal ones: a bf16 product's float32 bias
WIDE_BIAS = (torch.float32, torch.bfloat16)


def dot_producer(
    ctx: LoweringContext,
    ins: Instruction,
    bias: torch.Tensor | None = None,
    epilogue: str | None = None,
) -> Callable[[], torch.Tensor] | None:
    """A closure returning the product as a new tensor (plus `bias` along the last axis, then
    the activation `epilogue`, a key of `DNNL_EPILOGUES`), or None (declined: integer and fp8
    types, half, bf16 without `bf16_gemm`; a bias with a run-time right-hand side; an epilogue
    oneDNN does not take here)."""
    a_shape = ins.inputs[0].shape
    dtype = torch_dtype(a_shape.dtype())
    if dtype not in GEMM_DTYPES or (dtype == torch.bfloat16 and not bf16_gemm(ctx)):
        return None
    if bias is not None and bias.dtype != dtype and (bias.dtype, dtype) != WIDE_BIAS:
        return None
    env = ctx.env
    a, b = ctx.args(ins)
    out_lens = tuple(ins.shape.lens())
    w = batch_broadcast_matrix(ctx, ins, 1)
    if w is None:
        if bias is not None or epilogue is not None:
            return None
        mm = torch.matmul
        return lambda: mm(env[a], env[b])
    k, n = w.shape
    rows = ins.shape.elements() // n if n else 0
    if dtype in (torch.float32, torch.bfloat16) and rows > 0 and k > 0:
        kernel = fast_kernel(ctx, ins, w, rows, bias, epilogue)
        if kernel is None:
            return None
        if isinstance(kernel, ClassifierKernel):
            lean = kernel.producer(env, a, out_lens)
            if lean is not None:
                return lean
        return lambda: kernel(env[a].reshape(rows, k)).view(out_lens)
    if epilogue is not None:
        return None
    if bias is not None:
        addmm = torch.addmm
        return lambda: addmm(bias, env[a].reshape(rows, k), w).view(out_lens)
    mm = torch.matmul
    return lambda: mm(env[a], w)


@lowering("dot")
def lower_dot(ctx: LoweringContext, ins: Instruction) -> bool:
    dtype = torch_dtype(ins.shape.dtype())
    if dtype == torch.float16 or (dtype == torch.bfloat16 and not bf16_gemm(ctx)):
        return _lower_low_precision_dot(ctx, ins)
    user = ins.outputs[0] if len(ins.outputs) == 1 else None
    blocked = user is not None and _blocked_matrix(ctx, ins, user) is not None
    if blocked and defer(ctx, ins, user, _fuse_dot):
        return True  # (no whole packed weight: `_emit_widened_blocks` packs blocks)
    parts = _column_parts(ctx, ins, ins)
    if parts is not None:
        _emit_column_parts(ctx, ins, None, None, parts)
        return True
    if (
        user is not None
        and _epilogue_ok(ins, user)
        and _column_parts(ctx, ins, user) is not None
        and defer(ctx, ins, user, _fuse_parts)
    ):
        return True  # (packed per part: `_fuse_parts`)
    produce = dot_producer(ctx, ins)
    if produce is None:
        return False
    if user is not None and _epilogue_ok(ins, user) and defer(ctx, ins, user, _fuse_dot):
        return True
    _emit_produced(ctx, ins, produce)
    return True


def _emit_produced(ctx: LoweringContext, ins: Instruction, produce: Callable[[], Any]) -> None:
    """A step storing the new tensor `produce()` returns as `ins`'s value."""
    idx = ctx.bind_dynamic(ins)
    ctx.mark_fresh(idx)
    env = ctx.env

    def step() -> None:
        env[idx] = produce()

    ctx.emit(step, ins, idx)


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
    """`user` is an element-wise group `_fuse_dot` can take: of the product's shape, and of its
    type or, for a bf16 product, float32 (`quantize_bf16`'s products into a float32 sum)."""
    types = (producer.shape.type(), user.shape.type())
    return (
        user.op.name == "pointwise"
        and (types[0] == types[1] or types == ("bf16_type", "float_type"))
        and user.shape.lens() == producer.shape.lens()
        and trace_group(user.module_inputs[0]) is not None
        and sum(1 for i in user.inputs if i is producer) == 1
    )


def _fuse_dot(ctx: LoweringContext, user: Instruction) -> bool:
    """dot -> its element-wise user: a bias add in the group goes into the GEMM, and the rest
    of the group updates the product in place, which becomes the group's value (profiling
    runs the dot and the group as separate steps)."""
    dot = deferred_producer(ctx, user)
    if _emit_widened_blocks(ctx, dot, user):
        return True
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
        j for j, x in enumerate(user.inputs) if x is not dot and bias_vector(ctx, x, n) is not None
    }
    bias = None
    peeled = peel_add(trace, result, k, biases)
    if peeled is not None:
        candidate = bias_vector(ctx, user.inputs[peeled[2]], n)
        if dot_producer(ctx, dot, candidate) is not None:
            trace, result, bias = peeled[0], peeled[1], candidate
    produce = dot_producer(ctx, dot, bias)
    assert produce is not None
    act = _activation(trace, result, k) if not _one_row(dot) else None
    if act is not None and gemm_gelu.native_gelu_f32(ctx, dot, user, act):
        gelu, base = native_gelu.PASSES[act](), produce
        base = gemm_gelu.wide_gelu_product(ctx, dot, bias, unfused) or base  # (FFN-up: native)
        produce = lambda: gelu(base())  # noqa: E731  (the product, then the pass in place)
        result = trace.inputs[k]
    elif act is not None and (wide := gemm_gelu.native_gelu_bf16(ctx, dot, user, act, bias)) is not None:
        produce, result = wide, trace.inputs[k]  # (the product in float32, the pass rounds)
    elif act is not None and dot_producer(ctx, dot, bias, act) is not None:
        produce = dot_producer(ctx, dot, bias, act)
        result = trace.inputs[k]  # the GEMM applies the whole group
    uidx = ctx.index[id(user)]
    widened = user.shape.type() != dot.shape.type()
    residual, in_place = None, True
    if widened and act is None:
        found = widened_residual_sum(ctx, dot, user, trace, result, k)
        if found is not None:
            residual, in_place = found
    if widened and residual is None:
        _emit_widening(ctx, dot, user, produce, (trace, result), unfused)
        return True
    if ctx.static[uidx]:
        # the profiling steps store the group's value at its index like the fused step does
        unfused[-1].fn = storing(unfused[-1].fn, ctx.env, uidx, ctx.env[uidx])
    ctx.static[uidx] = False
    ctx.mark_fresh(uidx)
    env = ctx.env
    if not widened and act is None:
        residual = residual_sum(ctx, dot, user, trace, result, k)
    if residual is not None:
        emit_residual_sum(ctx, dot, user, bias, residual, produce, unfused, widened, in_place)
        return True
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


def _emit_widening(
    ctx: LoweringContext,
    dot: Instruction,
    user: Instruction,
    produce: Callable[[], torch.Tensor],
    traced: tuple[Any, Any],
    unfused: list,
) -> None:
    """A bf16 product (its bias added inside the GEMM, before the one rounding) and the rest of
    its float32 group (the convert and, say, a residual add), written into the group's own
    slot, as one step; a group the program returns (a language model's logits) writes a new
    tensor each run instead (`_returned_fresh`)."""
    env = ctx.env
    didx, uidx = ctx.index[id(dot)], ctx.index[id(user)]
    if _returned_fresh(ctx, user, uidx, unfused):
        lens, empty = tuple(user.shape.lens()), torch.empty
        like = torch.empty(lens, dtype=torch.float32, device="meta")
        group = compile_into(ctx, *traced, ctx.args(user), like, out_expr=f"_env[{uidx}]")

        def step() -> None:
            env[didx] = produce()
            env[uidx] = empty(lens, dtype=torch.float32)
            group()

    else:
        group = compile_into(ctx, *traced, ctx.args(user), env[uidx])

        def step() -> None:
            env[didx] = produce()
            group()

    ctx.emit(step, [dot, user], uidx, unfused)


#: `0` keeps a returned widening group in its arena slot (copied out by every run's collect;
#: the A of `benchmarks/gpt12_ab.py --fresh`)
FRESH_ENV = "PGX_CPU_FRESH_OUTPUT"


def _returned_fresh(ctx: LoweringContext, user: Instruction, uidx: int, unfused: list) -> bool:
    """Whether the float32 group `user` of a widening step is a program output that the step
    should write into a new tensor (then marked fresh, its profiling twin storing the arena
    slot back as `_fuse_dot`'s do).

    Why: an output in an arena slot is copied by each run's `collect` (a later run overwrites
    the slot); GPT-2's bf16 logits at batch 1 are (1, 128, 50257) float32, 25.7 MB: the copy was
    1.8-2.0 ms of thread CPU a run at one thread (the 2-core EPYC, `benchmarks/gpt12_ab.py`).
    A new tensor costs no copy; its memory comes back from malloc's heap run after run
    (`keep_freed_memory`), so no page faults either. `FRESH_ENV=0`: the old way."""
    if os.environ.get(FRESH_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        return False
    if user.shape.dtype() != np.float32 or not any(o.is_return() for o in user.outputs):
        return False
    keep_freed_memory()
    if ctx.static[uidx]:
        unfused[-1].fn = storing(unfused[-1].fn, ctx.env, uidx, ctx.env[uidx])
    ctx.static[uidx] = False
    ctx.mark_fresh(uidx)
    return True


#: a bf16 product of at least this many values that its group only converts to float32 (a
#: language model's logits, an output) runs in column blocks of `WIDEN_BLOCK`
WIDEN_MIN = 1 << 25
WIDEN_BLOCK = 4096


def _emit_widened_blocks(ctx: LoweringContext, dot: Instruction, user: Instruction) -> bool:
    """A large bf16 product whose user only converts it to float32, as one step computing it
    in column blocks, each converted into the float32 result right after its GEMM, while it
    is in cache (GPT-2's (1024, 50257) logits at batch 8, one thread: 391 ms against 423 for
    the whole product, then its conversion; at batch 1 the whole product is faster, so smaller
    products are left as they are). The weight is packed per block, once."""
    w = _blocked_matrix(ctx, dot, user)
    if w is None:
        return False
    keep_freed_memory()
    k, n = w.shape
    rows = dot.shape.elements() // n
    blocks = []
    for c0 in range(0, n, WIDEN_BLOCK):
        key = ("dnnl_weight", id(dot.inputs[1]), rows, c0)
        if key not in ctx.packed_weights:
            block = w[:, c0 : c0 + WIDEN_BLOCK].t().contiguous()
            ctx.packed_weights[key] = torch.ops.mkldnn._reorder_linear_weight(block, rows)
        blocks.append((ctx.packed_weights[key], c0))
    ctx.bind_dynamic(dot)
    # a new tensor: an arena slot could share memory with the product's input, which every
    # block reads after the first has written
    uidx = ctx.bind_dynamic(user)
    ctx.mark_fresh(uidx)
    env, a, lens = ctx.env, ctx.arg(dot, 0), tuple(user.shape.lens())
    linear, empty = torch.ops.mkldnn._linear_pointwise, torch.empty

    def step() -> None:
        x = env[a].reshape(rows, k)
        out = empty((rows, n), dtype=torch.float32, device=x.device)
        for weight, c0 in blocks:
            out[:, c0 : c0 + WIDEN_BLOCK] = linear(x, weight, None, "none", [], "")
        env[uidx] = out.view(lens)

    ctx.emit(step, [dot, user], uidx)
    return True


#: a float32 / bf16 product of at least this many rows whose (bias-added) result is only cut into
#: column parts of at least `PARTS_MIN_WIDTH` runs as one product per part (`_column_parts`)
PARTS_MIN_ROWS = 16
PARTS_MIN_WIDTH = 256

Part = tuple[int, int, Instruction]  # (first column, end column, the slice)


def _column_parts(ctx: LoweringContext, dot: Instruction, value: Instruction) -> list[Part] | None:
    """The slices cutting `value` (the float32 or native bf16 product `dot` with a fixed weight
    on oneDNN, or its bias-add group of the same type) into column parts, in column order, when
    they are its only users and cover its columns exactly once; else None.

    Why: a fused Q / K / V projection (`simplify_algebra.fuse_horizontal_dots`, GPT-2's
    `c_attn`) is cut into Q, K and V by slices, whose head views then have gaps between rows;
    oneDNN's attention matmuls take them only through a copy (`onednn_attention.Operand`). One
    product per part writes each part dense, and its head view is read as it is (the parts'
    products are as fast as the fused one: 128 x 768 x 3 x 768, one thread, 4.49 against 4.42
    ms warm, 4.59 against 4.58 cold). BERT-base at batch 1 (the 2-core EPYC while others
    worked, programs alternating in one process, `benchmarks/xfmr2_parts_ab.py`, process CPU
    ms a run): 223.5 / 221.8 against 226.0 / 227.0 at one thread, 238.0 / 237.9 against 241.4
    / 241.1 at two; attention 10.2-10.9 against 11.7-12.3, view steps 0.7 against 1.1; GPT-2
    320.3 against 320.6 (attention 10.7 against 11.9); ViT-B/16 and MiniLM lose their copies
    too (benchmarks/results/xfmr2_parts_ab.txt); bf16 programs (one thread, one process, 10
    runs): BERT-base 118.4 against 120.8 ms of CPU a run, GPT-2 168.2 against 170.7, outputs
    as close to ORT's as before. Not for a few rows (a decoder's token step:
    three calls' fixed cost) nor on other kernels than oneDNN."""
    lens = value.shape.lens()
    types = {dot.shape.type(), value.shape.type()}
    if not (types == {"float_type"} or types == {"bf16_type"} and bf16_gemm(ctx)):
        return None
    if not use_dnnl(ctx) or len(lens) < 2:
        return None
    n, users = lens[-1], value.outputs
    if len(users) < 2 or dot.shape.elements() // max(n, 1) < PARTS_MIN_ROWS:
        return None
    if batch_broadcast_matrix(ctx, dot, 1) is None:
        return None
    parts = []
    for u in users:
        if u.op.name != "slice" or len(u.inputs) != 1 or len(u.op.axes) != 1:
            return None
        if u.op.axes[0] % len(lens) != len(lens) - 1:
            return None
        start, end = (_clamped(e, n) for e in (u.op.starts[0], u.op.ends[0]))
        parts.append((start, end, u))
    parts.sort(key=lambda part: part[0])
    ends = [0] + [end for _, end, _ in parts]
    if [start for start, _, _ in parts] != ends[:-1] or ends[-1] != n:
        return None
    if any(end - start < PARTS_MIN_WIDTH for start, end, _ in parts):
        return None
    return parts


def _clamped(e: int, n: int) -> int:
    """A slice bound along an axis of length `n`, numpy's way (negative from the end)."""
    return max(0, min(n, e + n if e < 0 else e))


def _fuse_parts(ctx: LoweringContext, user: Instruction) -> bool:
    """dot -> bias add -> column slices: one product per part, each with its bias slice, when
    the group is the bias add alone; else as `_fuse_dot`."""
    dot = deferred_producer(ctx, user)
    parts = _column_parts(ctx, dot, user)
    traced = trace_group(user.module_inputs[0], scalar_inputs(ctx, user))
    if parts is None or traced is None:
        return _fuse_dot(ctx, user)
    k, n = user.inputs.index(dot), dot.shape.lens()[-1]
    biases = {
        j for j, x in enumerate(user.inputs) if x is not dot and bias_vector(ctx, x, n) is not None
    }
    peeled = peel_add(*traced, k, biases)
    if peeled is None or peeled[1].kind != "in" or peeled[1].index != k:
        return _fuse_dot(ctx, user)
    bias = bias_vector(ctx, user.inputs[peeled[2]], n)
    if bias is None or bias.dtype not in (torch_dtype(dot.shape.dtype()), torch.float32):
        return _fuse_dot(ctx, user)
    _emit_column_parts(ctx, dot, user, bias, parts)
    return True


def _emit_column_parts(
    ctx: LoweringContext,
    dot: Instruction,
    group: Instruction | None,
    bias: torch.Tensor | None,
    parts: list[Part],
) -> None:
    """One step computing the column parts of `dot` (+ `bias`), each into its slice's value (a
    new tensor): parts of equal width as one batched product (`_batched_parts`), else each as
    its own oneDNN product; the product and its group get no value. Profiling runs one step
    per slice (a batched product's first one computes all parts)."""
    w = batch_broadcast_matrix(ctx, dot, 1)
    k, n = w.shape
    rows = dot.shape.elements() // n
    keep_freed_memory()
    env, a = ctx.env, ctx.arg(dot, 0)
    batched, held = _batched_parts(ctx, dot, w, rows, bias, parts), [None]
    first = itemgetter(0)
    kernels, unfused, members = [], [], [dot] + ([group] if group is not None else [])
    for p, (start, end, part) in enumerate(parts):
        b = None if bias is None else bias[start:end].contiguous()
        product = dnnl_kernel(ctx, dot, w, rows, b, None, (start, end)) if not batched else None
        idx = ctx.bind_dynamic(part)
        ctx.mark_fresh(idx)
        ctx.fusers[id(part)] = _bound
        views = view_chain(ctx, part)
        kernels.append((idx, product, tuple(part.shape.lens()), views))
        members += [part, *(ins for ins, _, _ in views)]

        # (the part's number behind `itemgetter`: `mapped_reads` takes an int a step holds
        # for an env index)
        def one(
            kernel: tuple = kernels[-1], pick: Callable = itemgetter(p) if p else first
        ) -> None:
            idx, product, lens, _ = kernel
            x = env[a].reshape(rows, k)
            if product is None and pick is first:
                held[0] = batched(x)
            env[idx] = (pick(held[0]) if product is None else product(x)).view(lens)

        unfused.append(Step(one, [part], idx))
        unfused += [Step(view_step(env, src, fn, out), [ins], out) for ins, fn, (src, out) in views]
    ctx.bind_dynamic(dot)
    if group is not None:
        ctx.bind_dynamic(group)

    def step() -> None:
        x = env[a].reshape(rows, k)
        whole = batched(x) if batched is not None else None
        for p, (idx, product, lens, views) in enumerate(kernels):
            env[idx] = y = (product(x) if whole is None else whole[p]).view(lens)
            for _, fn, (_, out) in views:
                env[out] = y = fn(y)

    members.sort(key=lambda i: ctx.position[id(i)])
    ctx.emit(step, members, ctx.index[id(members[-1])], unfused)


def _batched_parts(
    ctx: LoweringContext,
    dot: Instruction,
    w: torch.Tensor,
    rows: int,
    bias: torch.Tensor | None,
    parts: list[Part],
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The parts of equal width as one batched product (`gemm_kernels.dnnl_parts_kernel`),
    or None (unequal widths, no C API library): then one product per part."""
    widths = {end - start for start, end, _ in parts}
    if len(widths) != 1:
        return None
    if dot.shape.type() == "float_type":  # (Q / K / V: the native kernel where it is faster)
        wide = wide_parts_kernel(ctx, dot, w, rows, bias, len(parts))
        if wide is not None:
            return wide
    return dnnl_parts_kernel(ctx, dot, w, rows, bias, len(parts))


def _bound(ctx: LoweringContext, ins: Instruction) -> bool:
    """A slice whose value the column-parts step of its product stores: no step of its own."""
    return True


def _blocked_matrix(ctx: LoweringContext, dot: Instruction, user: Instruction) -> Any:
    """The fixed (K, N) bf16 weight of `dot` when `_emit_widened_blocks` takes it, else None."""
    types = (dot.shape.type(), user.shape.type())
    if types != ("bf16_type", "float_type") or not _only_converts(user) or not bf16_gemm(ctx):
        return None
    w = batch_broadcast_matrix(ctx, dot, 1)
    n = dot.shape.lens()[-1]
    if w is None or dot.shape.elements() < WIDEN_MIN or n <= WIDEN_BLOCK or w.shape[0] == 0:
        return None
    return w


def _only_converts(user: Instruction) -> bool:
    """`user` is an element-wise group that only converts its one input."""
    ops = [i for i in user.module_inputs[0].instructions if not (i.is_param() or i.is_return())]
    return len(user.inputs) == 1 and len(ops) == 1 and ops[0].op.name == "convert"


def _activation(trace: Any, result: Any, k: int) -> str | None:
    """The activation when the (bias-peeled) group is exactly `act(input k)`, else None."""
    if len(trace.nodes) != 1 or result.kind != "node" or result.index != 0:
        return None
    node = trace.nodes[0]
    (x, *rest) = node.args or [None]
    ok = not rest and getattr(x, "kind", None) == "in" and x.index == k
    return node.fn if ok and node.fn in DNNL_EPILOGUES else None


def _one_row(dot: Instruction) -> bool:
    """A float32 product of one row that runs on `addmm` (`gemm_select.one_row_on_addmm`): its
    activation is applied after it rather than inside oneDNN's GEMM."""
    lens = dot.shape.lens()
    if dot.shape.type() != "float_type" or len(lens) < 2 or dot.shape.elements() != lens[-1]:
        return False
    k = dot.inputs[0].shape.lens()[-1]
    return gemm_select.one_row_on_addmm(1, k, lens[-1])


def lower_dot_alone(ctx: LoweringContext, ins: Instruction) -> None:
    produce = dot_producer(ctx, ins)
    assert produce is not None
    _emit_produced(ctx, ins, produce)
