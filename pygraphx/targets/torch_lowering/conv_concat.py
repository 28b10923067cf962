"""A concat along the channels whose only user is a 1x1 convolution, run as one convolution
per part summed into the convolution's output (YOLOv8's C2f and SPPF blocks).

conv1x1(concat(x1, ..., xn), W) = sum_i conv1x1(x_i, W[:, c_i]) with W split by input
channels. On the cpu target, where oneDNN's own library runs the convolution (`dnnl`), such a
concat is deferred into the convolution (and the convolution into its epilogue group, as
`conv_fusion` does): one step runs the parts' convolutions through `onednn_conv.build_sum`,
the first writing the output (with the bias), each later one adding into it (oneDNN's sum
post-op), the last applying the epilogue (silu, an add). The concat is never written: a C2f
concat of 3-4 parts is 2-3 strided window copies, and a 1x1 convolution over the concat's
slice of a wider tensor is slower than over dense parts. The weight slices are packed once,
at prepare. Consecutive slices of one tensor (the two halves of a C2f's first convolution)
are one part: the whole tensor.

The memory plan keeps every part alive until the fused step (`sum_reader`, in the cpu
target's `fused_reads`), so the output's slot never overlaps a part that is still read.

Only where it is faster: the per-part chain against the concat's copies plus one
convolution, timed at prepare on the layer's shapes (`conv_choice.race`, the same protocol
and budget as the kernel choice, cached the same way); the chain runs where it is faster by
more than `conv_choice.MARGIN` (5%), the concat where the compile's budget is spent. In
YOLOv8n's network a chain over four 20x20 parts (SPPF) ran 10% slower than the concat and
one convolution though it timed 1% faster alone: the chain reads and writes the output once
per part, which pays only where the concat's copies are large.
`PGX_CONV_CONCAT_SUM`: `measure` (the default), `on` (wherever it applies, nothing timed),
`off` (never). A concat that takes a deferred upsample
(`lower_resize.concat_with_repeat`), parts that are not dense channels-last tensors, or a
convolution not on the `dnnl` kernel keep the concat.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering import onednn_conv
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, LoweringContext
from pygraphx.targets.torch_lowering.conv_choice import (
    choice_key,
    choice_state,
    choose_impl,
    default_kernel,
    measured_choice,
    race,
)
from pygraphx.targets.torch_lowering.conv_fusion import (
    Epilogue,
    conv_plan,
    emit_fused,
    fused_user,
    lower_alone,
    match_epilogue,
    mkldnn_usable,
    unfused_stores,
)
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan, kernels_for
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.fallback import lower_fallback
from pygraphx.targets.torch_lowering.lower_layout import (
    concat_axis,
    concat_parts,
    lower_concat,
    part_reader,
)
from pygraphx.targets.torch_lowering.registry import defer, deferred_producer

MODE_ENV = "PGX_CONV_CONCAT_SUM"
MODES = ("measure", "on", "off")
#: the choice's candidates, the default first: the concat and one convolution, then the sum
#: chain (chosen where it is more than `conv_choice.MARGIN` faster: on YOLOv8n at 640x640,
#: 2-core EPYC, the layers at 80x80 and 160x160, `benchmarks/results/c2fsum.md`)
CANDIDATES = ["concat", "sum"]


class ConcatSumError(ValueError):
    """A bad `PGX_CONV_CONCAT_SUM` value."""


def sum_conv(concat: Instruction) -> Instruction | None:
    """The 1x1 convolution (stride 1, no padding, one group, a literal weight) that is the
    only user of the 4-D channel concat `concat`, else None."""
    if concat.op.name != "concat" or len(concat.outputs) != 1 or concat.shape.ndim() != 4:
        return None
    if concat_axis(concat) != 1 or len(concat.inputs) < 2:
        return None
    conv = concat.outputs[0]
    if conv.op.name != "convolution" or len(conv.inputs) != 2 or conv.inputs[0] is not concat:
        return None
    op, w = conv.op, conv.inputs[1]
    begin, end = op.pads(concat.shape.lens(), w.shape.lens())
    return (
        conv
        if w.is_literal()
        and w.shape.lens()[2:] == [1, 1]
        and op.group == 1
        and all(s == 1 for s in op.stride)
        and not any(begin) and not any(end)
        else None
    )  # fmt: skip


def sum_reader(ins: Instruction) -> Instruction | None:
    """The instruction whose step reads the parts of concat `ins` when it runs as a sum chain
    (the convolution, or its epilogue group), else None: part of the cpu target's
    `fused_reads`, so that the memory plan keeps the parts live through that step."""
    conv = sum_conv(ins)
    if conv is None:
        return None
    return fused_user(conv) or conv


def lower_concat_or_sum(ctx: LoweringContext, ins: Instruction) -> bool:
    """The cpu target's concat lowering: deferred into its 1x1 convolution when `sum_conv`
    finds one (decided when the convolution is reached), else `lower_concat`."""
    conv = sum_conv(ins)
    if (
        conv is not None
        and _mode() != "off"
        and id(ins) not in ctx.producers  # (an upsample deferred into it)
        and onednn_conv.available()
        and defer(ctx, ins, conv, _fuse_conv)
    ):
        return True
    return lower_concat(ctx, ins)


def _mode() -> str:
    mode = os.environ.get(MODE_ENV, "measure").strip().lower() or "measure"
    if mode not in MODES:
        raise ConcatSumError(f"{MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def _fuse_conv(ctx: LoweringContext, conv: Instruction) -> bool:
    """The convolution's fuser: the sum chain when it applies and is faster (then deferred
    into the epilogue group when there is one), else the concat now and the convolution as
    usual (False)."""
    concat = deferred_producer(ctx, conv)
    if not _chain_pays(ctx, concat, conv):
        lower_concat(ctx, concat)
        return False
    user = fused_user(conv)
    if user is not None and defer(ctx, conv, user, _fuse_user):
        return True
    _emit(ctx, concat, conv, None)
    return True


def _fuse_user(ctx: LoweringContext, user: Instruction) -> bool:
    """The epilogue group's fuser: one step for the concat, the convolution and the group;
    a group whose form no oneDNN post-op chain runs gets the chain without it (False: the
    group then lowers on its own, reading the convolution's result)."""
    conv = deferred_producer(ctx, user)
    concat = deferred_producer(ctx, conv)
    epi = match_epilogue(ctx, conv, user, add_after=True)
    if epi is None:
        _emit(ctx, concat, conv, None)
        return False
    _emit(ctx, concat, conv, user, epi)
    return True


def _dense_parts(ctx: LoweringContext, concat: Instruction) -> list[int] | None:
    """The channel counts of the concat's parts (`concat_parts`) when each is a dense
    channels-last tensor: a channels-last value that is no view, or consecutive slices that
    cover the whole of one such value; else None."""
    lengths, k = [], 0
    for _, widened, length in concat_parts(ctx, concat, 1):
        x = concat.inputs[k]
        source = x.inputs[0] if widened else x
        starts_at_0 = not widened or x.op._bounds(source.shape)[1][0] == 0
        if (
            source.shape.lens()[1] != length
            or not starts_at_0
            or source.op.output_alias(len(source.inputs)) >= 0
            or ctx.layout[ctx.index[id(source)]] != CHANNELS_LAST
        ):
            return None
        lengths.append(length)
        while length > 0:  # the inputs this part covers
            length -= concat.inputs[k].shape.lens()[1]
            k += 1
    return lengths


def _chain_pays(ctx: LoweringContext, concat: Instruction, conv: Instruction) -> bool:
    """Whether the sum chain applies to `conv` (the `dnnl` kernel, dense parts, a layer
    oneDNN runs natively) and, `measure`, is faster than the concat and one convolution."""
    if not mkldnn_usable(ctx, conv):
        return False
    lengths = _dense_parts(ctx, concat)
    if lengths is None or len(lengths) < 2:
        return False
    plan = conv_plan(ctx, conv)
    state = choice_state(ctx.options, ctx.cache)
    if state.mode not in ("impl", "measure", "off", "dnnl"):  # another kernel forced
        return False
    if default_kernel(kernels_for(plan)) != "dnnl":
        return False
    if _mode() == "on":
        return True
    key = choice_key(plan, CANDIDATES, None) + repr(lengths)
    choice = measured_choice(state, key, CANDIDATES, lambda d: time_chain(plan, lengths, d))
    state.chosen[f"concat_{choice}"] += 1
    return choice == "sum"


def part_plans(plan: ConvPlan, lengths: list[int], epi: Epilogue | None = None) -> list[ConvPlan]:
    """`plan` (a 1x1 convolution) split into one plan per part of `lengths` input channels:
    the first with the bias, each later one accumulating, the last with the epilogue `epi`'s
    activation and add operand (set by the caller: `other`)."""
    n, _, h, w = plan.x_lens
    plans, start = [], 0
    for k, length in enumerate(lengths):
        plans.append(
            replace(
                plan,
                weight=plan.weight[:, start : start + length].contiguous(),
                x_lens=[n, length, h, w],
                bias=plan.bias if k == 0 else None,
                unary="none",
                scalars=[],
                other=None,
                add_after=False,
                accumulate=k > 0,
                impl=None,
                kernel="dnnl",
                in_place=False,
            )
        )
        start += length
    if epi is not None:
        last = plans[-1]
        last.unary, last.scalars, last.add_after = epi.unary, list(epi.scalars), epi.add_after
    return plans


def time_chain(plan: ConvPlan, lengths: list[int], deadline: float) -> dict[str, float]:
    """Best seconds per call of the concat's copies plus `plan` (oneDNN's first
    implementation) and of the sum chain over parts of `lengths` channels, both writing one
    output, timed as `conv_choice.race` times kernels."""
    cl, dtype = torch.channels_last, plan.weight.dtype

    def filled(shape: list[int]) -> torch.Tensor:  # (oneDNN's time does not depend on values)
        return torch.empty(shape, dtype=dtype, memory_format=cl).fill_(0.5)

    n, _, h, w = plan.x_lens
    xs = [filled([n, c, h, w]) for c in lengths]
    cat, out = filled(plan.x_lens), filled(onednn_conv.geometry(plan)[3])
    whole = onednn_conv.build(replace(plan, impl=None), lambda: cat, None, out)
    copies = list(zip(cat.split(lengths, 1), xs, strict=True))

    def concat_then_conv() -> torch.Tensor:
        for window, x in copies:
            window.copy_(x)
        return whole()

    getters = [lambda x=x: x for x in xs]
    chain = onednn_conv.build_sum(part_plans(plan, lengths), getters, None, out)
    return race({"concat": concat_then_conv, "sum": chain}, xs, deadline)


def _emit(
    ctx: LoweringContext,
    concat: Instruction,
    conv: Instruction,
    user: Instruction | None,
    epi: Epilogue | None = None,
) -> None:
    """Emit the sum chain's step for `concat`, `conv` (and its group `user` with the
    epilogue `epi`), writing the last one's slot; the separate steps are kept for profiling."""
    from pygraphx.targets.torch_lowering.lower_math import lower_pointwise

    plan = conv_plan(ctx, conv)
    if epi is not None and epi.bias.any():  # oneDNN takes the bias in the input's type
        plan.bias = torch.from_numpy(epi.bias).to(torch_dtype(conv.shape.dtype()))
    saved, ctx.steps = ctx.steps, []
    lower_concat(ctx, concat)
    lower_alone(ctx, conv, measure=False)
    if user is not None and not lower_pointwise(ctx, user):
        lower_fallback(ctx, user)
    unfused, ctx.steps = ctx.steps, saved
    last = user or conv
    unfused_stores(ctx, unfused, ctx.index[id(last)])
    parts = concat_parts(ctx, concat, 1)
    lengths = [length for _, _, length in parts]
    plans = part_plans(plan, lengths, epi)
    state = choice_state(ctx.options, ctx.cache)
    for p in plans:  # oneDNN's fastest implementation of each part's convolution
        choose_impl(state, p)
    env = ctx.env
    getters = [part_reader(env, 1, p) for p in parts]
    get_other = None
    reads = list(concat.inputs)
    if epi is not None and epi.other is not None:
        o = ctx.index[id(epi.other)]
        get_other, reads = (lambda: env[o]), [*reads, epi.other]

    def build(out: torch.Tensor | None):  # noqa: ANN202
        if out is not None:  # (tests: the chain writes the slot itself, nothing copied)
            ctx.cache["conv_concat_into_slot"] = ctx.cache.get("conv_concat_into_slot", 0) + 1
        return onednn_conv.build_sum(plans, getters, get_other, out)

    emit_fused(ctx, [concat, conv, *([user] if user else [])], unfused, build, reads)
    ctx.cache["conv_concat_sum"] = ctx.cache.get("conv_concat_sum", 0) + 1


__all__ = [
    "MODE_ENV",
    "ConcatSumError",
    "lower_concat_or_sum",
    "part_plans",
    "sum_conv",
    "sum_reader",
    "time_chain",
]
