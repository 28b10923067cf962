"""CPU convolutions with their element-wise epilogue fused (oneDNN post-ops).

A 2-D float32 convolution whose weights are a literal (bf16 too, on a CPU with bf16
instructions, always on the default oneDNN kernel, `dnnl` or `onednn`) runs on channels-last
activations
through one of the kernels of `conv_kernels.py`, chosen per layer by measurement at prepare
(`conv_choice.py`): by default oneDNN's convolution with the weights reordered into its
blocked format once, at prepare (depthwise layers included), through its own C API (`dnnl`,
where the optional library is installed) or `mkldnn._convolution_pointwise`. The first convolution
converts its input to channels-last; every later one gets channels-last tensors from its
producers, whatever kernel they ran on, so no layout round trip happens between layers. The
oneDNN path is the one torch's own CPU compiler (inductor with freezing) takes, and it is where
most of a CNN's time goes.

When the convolution's only user is a `pointwise` group of the form

    act(conv + c1 + c2 + ... [+ other])     act in {none, relu, clip(0, 6), silu}

where each `c` is a constant broadcast along the channels (a bias) or a scalar, and `other` is
one full tensor (a residual, or a second branch's output), the group is folded into the
convolution: the constants are summed into one bias at prepare, `other` is a binary `add`
post-op and the activation a unary post-op, so the group costs no pass over memory of its own
(the group's form is read by `conv_epilogue_match.py`).
When `other` is a tensor allocated for this run that nothing reads after the group (a ResNet
block's shortcut), the convolution adds into it in place and the group's value is that tensor
(`_may_overwrite`): on ResNet-50's residual layers 4-15% less time than a new output.
The form act(conv + c1 + ...) + other (YOLO's C2f shortcut: Conv-BN-SiLU, then the block's
input added) is fused too, the activation post-op before the add (`ConvPlan.add_after`).
A 1x1 convolution with its group followed by a depthwise 3x3 one with its group (MobileNetV2's
expand + depthwise) may become one step on `dnnl` (oneDNN's depthwise post-op:
`conv_dw_fusion.py`); a whole inverted-residual block, or a network's head (1x1 + pooling +
classifier), one step on a native kernel (`conv_native.py`, asked first). The pieces of a step
these share (the plan, the unfused twins, the emission into a slot) are in `conv_steps.py`.
torch's mkldnn kernel (`onednn`) fuses an add followed by relu or nothing, `matmul` an add or
an activation, `dnnl` (oneDNN's own post-op chain) every form; a group with an add that no
oneDNN kernel fuses whole (`conv_kernels.fuses_epilogue`: without oneDNN's library, an add
followed by clip or silu, an add after the activation, an add with a pre-padded input) runs
apart from the convolution. The convolution must come right
before its user in the program (see `lower.defer`). Profiling runs the convolution (on the
default kernel) and the group as separate steps.

Where results live: with `conv_output="torch"` oneDNN allocates each convolution's output
and that tensor is the value (torch's CPU allocator reuses the memory of values released after
their last use; `malloc_keep.py` keeps glibc from handing large freed blocks back to the
kernel, which made every run fault in fresh pages at batch 8); with `conv_output="arena"` (the
cpu target's default, `cpu/target.py`) it is copied into the arena slot the memory plan gave
it, except on the `dnnl` kernel, which writes the slot itself (no allocation, no copy). A fused
step reads the convolution's input while it writes its group's slot, so the cpu target plans
the arena with `fused_user` as `fused_reads` (`memory_coloring.plan_memory`): the input then
lives through the group and never shares memory with its slot. `LoweringContext.apart`
checks it (a plan made without it, e.g. a direct `lower_module` call, keeps the copy on such
layers). The benchmark `benchmarks/arena_conv_ab.py` measures both modes A/B.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering import winograd
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, LoweringContext, Step
from pygraphx.targets.torch_lowering.conv_choice import choice_state, choose_kernel
from pygraphx.targets.torch_lowering.conv_dw_fusion import (
    dw_pair,
    enabled,
    fused_user,  # noqa: F401  (imported from here by the cpu target, conv_concat, tests)
    may_fuse,
    native,
)
from pygraphx.targets.torch_lowering.conv_epilogue_match import Epilogue, match_epilogue, wide_bias
from pygraphx.targets.torch_lowering.conv_kernels import (
    WRITES_OUT,
    ConvPlan,
    build_kernel,
    fuses_epilogue,
)
from pygraphx.targets.torch_lowering.conv_native import defer_block, defer_head
from pygraphx.targets.torch_lowering.conv_steps import (
    arena_output as _arena,
    conv_plan,
    emit_fused,
    env_getter,
    into as _into,
    lower_twin,
    twin_steps,
    unfused_stores,  # noqa: F401  (conv_concat imports it from here)
)
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.gemm_kernels import bf16_gemm
from pygraphx.targets.torch_lowering.malloc_keep import keep_freed_memory
from pygraphx.targets.torch_lowering.onednn_conv import available as dnnl_available
from pygraphx.targets.torch_lowering.onednn_conv import supports
from pygraphx.targets.torch_lowering.registry import defer, deferred_producer
from pygraphx.targets.torch_lowering.store import store_result
from pygraphx.targets.torch_lowering.winograd import activate_

CL = torch.channels_last


def mkldnn_usable(ctx: LoweringContext, ins: Instruction) -> bool:
    if ctx.device.type != "cpu" or not ctx.options.get("mkldnn", True):
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    x, w = ins.inputs
    return (
        (x.shape.type() == "float_type" or (x.shape.type() == "bf16_type" and bf16_gemm(ctx)))
        and x.shape.ndim() == 4
        and ctx.constant(ctx.arg(ins, 1)) is not None
        and ins.shape.elements() > 0
    )


def conv_producer(
    ctx: LoweringContext,
    x: int,
    plan: ConvPlan,
    other_lens: list[int] | None = None,
    out: torch.Tensor | None = None,
) -> Callable[[], torch.Tensor]:
    """The closure running `plan` on env[x] (and the add operand, of lens `other_lens`) and
    returning the (new) output tensor, on the kernel `conv_choice` picks for it (the unfused
    twin of a fused step, nothing timed: `conv_steps.twin_producer`). `out`: the result's
    arena slot, which the `dnnl` and Winograd kernels (`WRITES_OUT`) write
    themselves when it is channels-last (the closure then returns `out`; other kernels return a
    new tensor)."""
    env = ctx.env
    state = choice_state(ctx.options, ctx.cache)
    plan.kernel = choose_kernel(state, plan, other_lens)
    o = plan.other
    get_other = None if o is None else env_getter(env, o)
    # scratch12: a Winograd layer's temporaries are the program's (freed with it), shared by
    # its Winograd layers (its runs are serialised)
    wino = plan.kernel in winograd.KERNEL_TILES
    scratch = winograd.program_scratch(ctx.cache) if wino else None
    if out is not None and (
        plan.kernel not in WRITES_OUT or plan.in_place or not out.is_contiguous(memory_format=CL)
    ):
        out = None
    if out is not None:  # (tests, benchmarks: how many results need no copy)
        ctx.cache["conv_into_slot"] = ctx.cache.get("conv_into_slot", 0) + 1
    return build_kernel(plan, plan.kernel, env_getter(env, x), get_other, out, scratch)


def lower_mkldnn_convolution(ctx: LoweringContext, ins: Instruction) -> bool:
    if not mkldnn_usable(ctx, ins):
        return False
    if ctx.options.get("conv_output", "torch") != "arena":
        keep_freed_memory()  # each run's new outputs reuse the last run's freed blocks
    user = ins.outputs[0] if len(ins.outputs) == 1 else None
    # the epilogue is matched when the user is reached (its other inputs are lowered by then)
    if user is not None and may_fuse(ins, user) and defer(ctx, ins, user, fuse_group):
        return True
    lower_alone(ctx, ins)
    return True


def lower_alone(ctx: LoweringContext, ins: Instruction) -> None:
    """Lower the convolution `ins` as a step of its own, on the kernel `conv_choice` picks (an
    unfused twin, nothing timed: `conv_steps.lower_twin`)."""
    plan = conv_plan(ctx, ins)
    if not (_arena(ctx) and ctx.has_slot(ins)):
        store_result(ctx, ins, conv_producer(ctx, ctx.arg(ins, 0), plan), CHANNELS_LAST)
        return
    idx, out = ctx.output(ins, CHANNELS_LAST)
    ctx.emit(_into(out, conv_producer(ctx, ctx.arg(ins, 0), plan, out=out)), ins, idx)


def fuse_group(ctx: LoweringContext, user: Instruction) -> bool:
    """Emit conv + epilogue as one oneDNN call (the fuser of a convolution deferred into its
    group `user`); the separate steps are kept for profiling. A 1x1 convolution followed by a
    depthwise one may be deferred further and fused with it (`conv_dw_fusion`), a block or a
    head deferred to its end and run natively (`conv_native`)."""
    conv = deferred_producer(ctx, user)
    epi = match_epilogue(ctx, conv, user, add_after=True)
    if epi is None:  # not a form oneDNN fuses: the convolution runs first, on its own
        lower_alone(ctx, conv)
        return False
    plan = conv_plan(ctx, conv)
    dtype = torch_dtype(conv.shape.dtype())  # oneDNN takes the bias in the input's type, or
    if wide_bias(user, conv):  # float32 for a bf16 layer whose bias kept its float32 value
        dtype = torch.float32
    plan.bias = torch.from_numpy(epi.bias).to(dtype) if epi.bias.any() else None
    plan.unary, plan.scalars, plan.add_after = epi.unary, epi.scalars, epi.add_after
    if epi.other is not None:
        plan.other = ctx.index[id(epi.other)]
    # a group with an add that no kernel fuses whole (torch's mkldnn ops: only relu after the
    # add, none before it) runs apart from its convolution
    apart = epi.other is not None and not fuses_epilogue(plan)
    # rn11: the plan gave the group its residual's slot (`conv_residual.residual_slot`)
    over = epi.other is not None and not apart and not epi.add_after
    over = over and ctx.claim_shared(user, epi.other)
    unfused = twin_steps(ctx, conv, user, lower_alone if apart else lower_twin)
    if apart:
        ctx.steps = ctx.steps + unfused
        return True
    other_lens = None
    if epi.other is not None:
        other_lens = list(epi.other.shape.lens())
        plan.in_place = _may_overwrite(ctx, conv, epi.other, user)
        if over and _over_residual(ctx, epi, conv, user, unfused):  # rn11
            if dnnl_available() and supports(plan):  # oneDNN's sum post-op over the residual
                plan.accumulate, plan.other, other_lens = True, None, None
                ctx.cache["conv_over_residual"] = ctx.cache.get("conv_over_residual", 0) + 1
            else:  # (the add operand is the slot's own memory: written over, nothing copied)
                plan.in_place = True

    def build(out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        return conv_producer(ctx, ctx.arg(conv, 0), plan, other_lens, out=out)

    def emit() -> None:
        emit_fused(ctx, [conv, user], unfused, build, [conv.inputs[0]])
        if plan.in_place and plan.kernel in ("onednn", "dnnl"):  # (others allocate their result)
            ctx.cache["conv_in_place"] = ctx.cache.get("conv_in_place", 0) + 1

    if epi.other is None and defer_head(ctx, conv, user, plan, unfused):
        return True
    if epi.other is None and defer_block(ctx, conv, user, plan, unfused, emit, fuse_group):
        return True
    if epi.other is None and _defer_dw_pair(ctx, conv, user, plan, unfused, emit):
        return True
    emit()
    return True


def _over_residual(
    ctx: LoweringContext, epi: Epilogue, conv: Instruction, user: Instruction, unfused: list[Step]
) -> bool:
    """rn11: whether `user`'s claimed slot (its residual `epi.other`'s memory) and the
    residual are one channels-last tensor (else the group's result goes to a new tensor, its
    slot left unused). The unfused twin adds in a new tensor first: the pointwise code may
    write its slot before it has read all of the residual there."""
    uidx, oidx, cidx = ctx.index[id(user)], ctx.index[id(epi.other)], ctx.index[id(conv)]
    env, static = ctx.env, ctx.static
    slot, value = ctx.value(uidx), ctx.value(oidx)
    same = (
        slot is not None
        and value is not None
        and slot.is_contiguous(memory_format=CL)
        and value.data_ptr() == slot.data_ptr()
        and value.stride() == slot.stride()
        and value.shape == slot.shape
    )
    if not same:
        static[uidx] = False
    bias = torch.from_numpy(epi.bias).view(1, -1, 1, 1)
    unary, scalars = epi.unary, epi.scalars

    def twin() -> None:
        y = env[cidx] + env[oidx]
        y.add_(bias.to(y.dtype))
        activate_(y, unary, scalars)
        if static[uidx]:
            env[uidx].copy_(y)
        else:
            env[uidx] = y

    unfused[-1].fn = twin
    return same


def _may_overwrite(
    ctx: LoweringContext, conv: Instruction, other: Instruction, user: Instruction
) -> bool:
    """Whether the fused step may write its result over the add operand `other` (oneDNN's
    in-place sum): `other` is a tensor a step allocated for this run (not an arena slot, a
    parameter or a constant), of the group's shape, that nothing reads after the group (its
    other users are convolutions that run earlier; the fused convolution must not read it)."""
    if ctx.options.get("conv_output", "torch") == "arena":
        return False
    if not ctx.run_owned(other):
        return False
    if other.shape.lens() != user.shape.lens() or other.shape.type() != user.shape.type():
        return False
    pos = ctx.position
    if id(user) not in pos:
        return False
    for u in other.outputs:
        if u is user:
            continue
        if u is conv or u.op.name != "convolution" or pos.get(id(u), len(pos)) >= pos[id(user)]:
            return False
    return True


# --- a 1x1 convolution and the depthwise one after it (`conv_dw_fusion`) --------------------


def _defer_dw_pair(
    ctx: LoweringContext,
    conv: Instruction,
    group: Instruction,
    plan: ConvPlan,
    unfused: list[Step],
    emit_head: Callable[[], None],
) -> bool:
    """Called by `fuse_group` with the 1x1 convolution `conv`, its group `group`, its plan
    (epilogue set, no add operand), the pair's unfused twins and the function emitting the
    pair's own step: True when that step is deferred into the depthwise pair after it (one step
    for all four is emitted at the last group), False when the caller emits it now."""
    pair = dw_pair(conv)
    if pair is None or pair[0] is not group or not enabled(ctx.options):
        return False
    _, dw, last = pair
    if not native(plan, dw):
        return False

    def at_dw(ctx: LoweringContext, ins: Instruction) -> bool:
        if defer(ctx, dw, last, at_last):
            return True
        emit_head()  # the depthwise convolution is lowered as usual after it
        return False

    def at_last(ctx: LoweringContext, ins: Instruction) -> bool:
        return _emit_dw_pair(ctx, conv, plan, unfused, emit_head, dw, last)

    return defer(ctx, group, dw, at_dw)


def _emit_dw_pair(
    ctx: LoweringContext,
    conv: Instruction,
    plan: ConvPlan,
    unfused: list[Step],
    emit_head: Callable[[], None],
    dw: Instruction,
    last: Instruction,
) -> bool:
    """One step for the 1x1 convolution, its group, the depthwise convolution and its group;
    or, where the last group is no epilogue oneDNN fuses, the two pairs' steps as usual."""
    epi = match_epilogue(ctx, dw, last)
    dw_plan = conv_plan(ctx, dw)
    if epi is not None:
        dtype = torch_dtype(dw.shape.dtype())  # (as `fuse_group`: the bias in the input's type)
        dtype = torch.float32 if wide_bias(last, dw) else dtype
        dw_plan.bias = torch.from_numpy(epi.bias).to(dtype) if epi.bias.any() else None
        dw_plan.unary, dw_plan.scalars = epi.unary, epi.scalars
        plan.dw = dw_plan
    if epi is None or epi.other is not None or not supports(plan):
        plan.dw = None
        emit_head()
        return fuse_group(ctx, last)  # the depthwise pair's own step
    twins = twin_steps(ctx, dw, last)
    plan.kernel, plan.impl = "dnnl", None  # the fused kernel is oneDNN's first (`native`)
    env, x = ctx.env, ctx.arg(conv, 0)

    def build(out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        return build_kernel(plan, "dnnl", env_getter(env, x), None, out)

    emit_fused(ctx, [conv, conv.outputs[0], dw, last], unfused + twins, build, [conv.inputs[0]])
    ctx.cache["conv_dw_fused"] = ctx.cache.get("conv_dw_fused", 0) + 1  # (tests, benchmarks)
    return True
