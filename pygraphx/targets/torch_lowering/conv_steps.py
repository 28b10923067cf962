"""The pieces of a convolution's step that the fusions share (`conv_fusion`, `conv_native`,
`conv_concat`): a convolution's plan, its unfused twin (the default kernel, nothing timed: a
fused step's twin, run only when profiling), and the emission of one fused step into its
arena slot or a new tensor. Split out of `conv_fusion.py` (mnv16) so that the native block and
head steps (`conv_native.py`) and `conv_fusion` import them from below, without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering import winograd
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, LoweringContext, Step
from pygraphx.targets.torch_lowering.conv_choice import default_kernel
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan, kernels_for, lazy_kernel
from pygraphx.targets.torch_lowering.fallback import lower_fallback
from pygraphx.targets.torch_lowering.registry import storing
from pygraphx.targets.torch_lowering.store import store_result, torch_pad

#: lowers a convolution on its own as a step (`conv_fusion.lower_alone` or `lower_twin`)
ConvLowering = Callable[[LoweringContext, Instruction], None]


def conv_plan(ctx: LoweringContext, ins: Instruction) -> ConvPlan:
    """`ins`'s geometry, plain weight and oneDNN-packed weight (packed once per context, at
    the first kernel that uses it)."""
    op = ins.op
    x_shape, w_shape = (i.shape for i in ins.inputs)
    begin, end = op.pads(x_shape.lens(), w_shape.lens())
    pre_pad = None if begin == end else torch_pad(begin, end)
    padding = list(begin) if pre_pad is None else [0, 0]
    lens = list(x_shape.lens())
    if pre_pad is not None:
        lens = lens[:2] + [n + b + e for n, b, e in zip(lens[2:], begin, end, strict=True)]
    w = ctx.constant(ctx.arg(ins, 1))
    key = ("mkldnn_weight", id(ins.inputs[1]), tuple(padding), tuple(op.stride),
           tuple(op.dilation), op.group, tuple(lens))  # fmt: skip

    def packed() -> torch.Tensor:  # made when a kernel needs it (`dnnl` packs its own)
        if key not in ctx.packed_weights:
            ctx.packed_weights[key] = torch.ops.mkldnn._reorder_convolution_weight(
                w.contiguous(), padding, list(op.stride), list(op.dilation), op.group, lens
            )
        return ctx.packed_weights[key]

    return ConvPlan(w, packed, lens, padding, list(op.stride), list(op.dilation), op.group, pre_pad)


def env_getter(env: list, index: int) -> Callable[[], torch.Tensor]:
    """`lambda: env[index]`, saying where it reads (`slot`: `onednn_conv`'s lean closure then
    reads the slot itself, one Python call less a step)."""
    get = lambda: env[index]  # noqa: E731
    get.slot = (env, index)  # type: ignore[attr-defined]
    return get


def twin_producer(ctx: LoweringContext, x: int, plan: ConvPlan) -> Callable[[], torch.Tensor]:
    """The closure running `plan` on env[x] (and its add operand) on the default kernel,
    nothing timed: the unfused twin of a fused step, whose kernel is made at its first call
    (it runs only when profiling)."""
    env = ctx.env
    plan.kernel = default_kernel(kernels_for(plan))
    o = plan.other
    get_other = None if o is None else env_getter(env, o)
    # scratch12: a Winograd layer's temporaries are the program's (freed with it), shared by
    # its Winograd layers (its runs are serialised)
    scratch = winograd.program_scratch(ctx.cache) if plan.kernel in winograd.KERNEL_TILES else None
    return lazy_kernel(plan, plan.kernel, env_getter(env, x), get_other, scratch)


def lower_twin(ctx: LoweringContext, ins: Instruction) -> None:
    """Lower the convolution `ins` on its own as an unfused twin (`twin_producer`), storing a
    new tensor (or copying into its slot) as `store_result` does."""
    plan = conv_plan(ctx, ins)
    store_result(ctx, ins, twin_producer(ctx, ctx.arg(ins, 0), plan), CHANNELS_LAST)


def arena_output(ctx: LoweringContext) -> bool:
    """Whether convolutions write arena slots (`conv_output="arena"`) rather than new tensors."""
    return ctx.options.get("conv_output", "torch") == "arena"


def into(out: torch.Tensor, produce: Callable[[], torch.Tensor]) -> Callable[[], None]:
    """A step storing `produce()` in the arena slot `out` (nothing to copy when the kernel
    wrote it there itself; `produce` itself when it always does: `onednn_conv`'s closures
    that say so as `writes`, one Python call less a step)."""
    if getattr(produce, "writes", None) is out:
        return produce  # type: ignore[return-value]  # (its result, `out`, is not used)

    def step() -> None:
        y = produce()
        if y is not out:
            out.copy_(y)

    return step


def lower_group(ctx: LoweringContext, group: Instruction) -> None:
    """Lower a pointwise group on its own (its convolution ran apart)."""
    from pygraphx.targets.torch_lowering.lower_math import lower_pointwise

    if not lower_pointwise(ctx, group):
        lower_fallback(ctx, group)


def twin_steps(
    ctx: LoweringContext,
    conv: Instruction,
    user: Instruction,
    lower_conv: ConvLowering = lower_twin,
) -> list[Step]:
    """The steps running `conv` (lowered by `lower_conv`: by default as an unfused twin) and
    its group `user` apart (a fused step's unfused twins, for profiling), not emitted: the
    caller keeps them."""
    saved, ctx.steps = ctx.steps, []
    lower_conv(ctx, conv)
    lower_group(ctx, user)
    made, ctx.steps = ctx.steps, saved
    unfused_stores(ctx, made, ctx.index[id(user)])
    return made


def unfused_stores(ctx: LoweringContext, unfused: list[Step], uidx: int) -> None:
    """Make the last of a fused step's unfused twins store its result at `uidx` as the fused
    step does (a new tensor there unless the result has an arena slot)."""
    if not arena_output(ctx) and ctx.static[uidx]:
        unfused[-1].fn = storing(unfused[-1].fn, ctx.env, uidx, ctx.env[uidx])


def emit_fused(
    ctx: LoweringContext,
    instructions: list[Instruction],
    unfused: list[Step],
    build: Callable[[torch.Tensor | None], Callable[[], torch.Tensor]],
    reads: list[Instruction],
) -> None:
    """Emit one step computing `instructions` (their unfused twins `unfused`, for
    profiling) with the closure `build(out)` makes: it writes the last instruction's arena
    slot `out` itself when the slot shares no memory with the values it `reads` (else `out`
    is None and its result is copied there), or stores a new tensor where there is no slot."""
    last = instructions[-1]
    uidx = ctx.index[id(last)]
    env = ctx.env
    slot = env[uidx] if arena_output(ctx) and ctx.static[uidx] else None
    # the kernel writes the slot itself unless it is an input's memory (then a copy)
    direct = slot if slot is not None and all(ctx.apart(x, last) for x in reads) else None
    produce = build(direct)
    if slot is not None:
        step = into(slot, produce)
    else:
        ctx.static[uidx] = False
        ctx.mark_fresh(uidx)

        def step() -> None:
            env[uidx] = produce()

        step.stores = (uidx, produce)  # type: ignore[attr-defined]  (`native_mbchain`)
    ctx.emit(step, instructions, uidx, unfused)
    ctx.layout[uidx] = CHANNELS_LAST
