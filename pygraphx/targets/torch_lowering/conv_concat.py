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

A part that is a nearest upsample (YOLOv8's neck: `up(c5), c4` and `up(t4), c3`, which
`lower_resize.concat_with_repeat` would otherwise write into the concat) runs its
convolution at the upsample's input size (a 1x1 convolution commutes with a nearest
upsample: a quarter of that part's work), into a buffer of its own with the bias; the result
is repeated into the output, and the other parts' convolutions add into it (`up_part`,
`lower_resize_or_sum`). The upsample is never written either.

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
`off` (never). Parts that are not dense channels-last tensors (a graph input, a lone
channel slice), two upsample parts, or a convolution not on the `dnnl` kernel keep the
concat. The concat's arena slot is still planned (written only by the profiled run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.settings import env_choice
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
from pygraphx.targets.torch_lowering.conv_epilogue_match import (
    Epilogue,
    match_epilogue,
    wide_bias,
)
from pygraphx.targets.torch_lowering.conv_fusion import (
    conv_plan,
    emit_fused,
    fused_user,
    mkldnn_usable,
    unfused_stores,
)
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan, Getter, kernels_for
from pygraphx.targets.torch_lowering.conv_steps import lower_twin
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.fallback import lower_fallback
from pygraphx.targets.torch_lowering.lower_layout import (
    concat_axis,
    concat_groups,
    concat_parts,
    lower_concat,
    part_reader,
)
from pygraphx.targets.torch_lowering.lower_resize import (
    concat_reader,
    concat_with_repeat,
    lower_resize,
    lower_resize_alone,
    repeat_factors,
    repeat_writer,
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
    if ins.op.name == "resize":  # an upsample part: its input is read in that step too
        concat = concat_reader(ins)
        return None if concat is None or up_part(concat) is not ins else sum_reader(concat)
    conv = sum_conv(ins)
    if conv is None:
        return None
    return fused_user(conv) or conv


def up_part(concat: Instruction) -> Instruction | None:
    """The nearest upsample (`lower_resize.concat_reader`) that is one part of `concat`, when
    `concat` has a `sum_conv` and no other upsample part, else None: the chain runs that
    part's convolution at the upsample's input size and repeats its result into the output
    (a 1x1 convolution commutes with a nearest upsample), the upsample never written."""
    if sum_conv(concat) is None:
        return None
    ups = [x for x in concat.inputs if concat_reader(x) is concat]
    return ups[0] if len(ups) == 1 and concat.inputs.count(ups[0]) == 1 else None


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


def lower_resize_or_sum(ctx: LoweringContext, ins: Instruction) -> bool:
    """The cpu target's resize lowering: an upsample part of a concat that may run as a sum
    chain (`up_part`) is deferred into the concat (and the concat into its convolution),
    else `lower_resize`."""
    concat = concat_reader(ins)
    if (
        concat is not None
        and _mode() != "off"
        and up_part(concat) is ins
        and onednn_conv.available()
        and defer(ctx, ins, concat, _fuse_concat_up)
    ):
        return True
    return lower_resize(ctx, ins)


def _fuse_concat_up(ctx: LoweringContext, concat: Instruction) -> bool:
    """The fuser of a concat with a deferred upsample part: deferred into its convolution,
    else the upsample written into the concat (`concat_with_repeat`)."""
    conv = sum_conv(concat)
    if conv is not None and defer(ctx, concat, conv, _fuse_conv):
        return True
    return concat_with_repeat(ctx, concat)


def _concat_alone(ctx: LoweringContext, concat: Instruction) -> None:
    """Lower `concat` (with its deferred upsample part, if any) as it runs without a chain."""
    if id(concat) in ctx.producers and concat_with_repeat(ctx, concat):
        return
    if not lower_concat(ctx, concat):
        lower_fallback(ctx, concat)


def _mode() -> str:
    return env_choice(MODE_ENV, MODES, "measure", lower=True, error=ConcatSumError)


def _fuse_conv(ctx: LoweringContext, conv: Instruction) -> bool:
    """The convolution's fuser: the sum chain when it applies and is faster (then deferred
    into the epilogue group when there is one), else the concat now and the convolution as
    usual (False)."""
    concat = deferred_producer(ctx, conv)
    if not _chain_pays(ctx, concat, conv):
        _concat_alone(ctx, concat)
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
    """The channel counts of the concat's parts (`concat_groups`) when each is a dense
    channels-last tensor: a channels-last value that is no view, consecutive slices that
    cover the whole of one such value, or the upsample of one (`up_part`); else None."""
    lengths = []
    up = ctx.producers.get(id(concat))  # the deferred upsample part, if any
    for group in concat_groups(concat, 1):
        x = group[0]
        source = x.inputs[0] if len(group) > 1 or x is up else x
        length = sum(g.shape.lens()[1] for g in group)
        starts_at_0 = len(group) == 1 or x.op._bounds(source.shape)[1][0] == 0
        if (
            source.shape.lens()[1] != length
            or not starts_at_0
            or source.op.output_alias(len(source.inputs)) >= 0
            or ctx.layout[ctx.index[id(source)]] != CHANNELS_LAST
        ):
            return None
        lengths.append(length)
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
    up = _up_index(ctx, concat)
    key = choice_key(plan, CANDIDATES, None) + repr((lengths, up))
    timer = lambda d: time_chain(plan, lengths, d, up)  # noqa: E731
    choice = measured_choice(state, key, CANDIDATES, timer)
    state.chosen[f"concat_{choice}"] += 1
    return choice == "sum"


def _up_index(ctx: LoweringContext, concat: Instruction) -> tuple[int, list[int]] | None:
    """(the part index of the concat's deferred upsample, its repeat factors), or None."""
    up = ctx.producers.get(id(concat))
    if up is None:
        return None
    k = next(i for i, g in enumerate(concat_groups(concat, 1)) if g[0] is up)
    factors = repeat_factors(up)
    assert factors is not None  # (`concat_reader` checked them)
    return k, factors


def part_plans(
    plan: ConvPlan,
    lengths: list[int],
    epi: Epilogue | None = None,
    up: tuple[int, list[int]] | None = None,
) -> list[ConvPlan]:
    """`plan` (a 1x1 convolution) split into one plan per part of `lengths` input channels:
    the first with the bias, each later one accumulating, the last with the epilogue `epi`'s
    activation (its add operand is the caller's). `up` = (k, factors): part k is a nearest
    upsample by `factors`; its plan comes first, at the upsample's input size, with the bias
    (its result, repeated, is the output's first value), and every other part accumulates."""
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
    if up is not None:
        k, (fh, fw) = up
        low = [n, lengths[k], h // fh, w // fw]
        for p in plans:
            p.bias, p.accumulate = None, True
        plans.insert(0, replace(plans.pop(k), x_lens=low, bias=plan.bias, accumulate=False))
    if epi is not None:
        last = plans[-1]
        last.unary, last.scalars, last.add_after = epi.unary, list(epi.scalars), epi.add_after
    return plans


def up_chain(
    plans: list[ConvPlan],
    get_low: Getter,
    getters: list[Getter],
    get_other: Getter | None,
    out: torch.Tensor | None,
    factors: list[int] | None,
) -> Callable[[], torch.Tensor]:
    """The sum chain of `plans` (`part_plans`); with an upsample part (`factors`), its
    convolution at the input size `get_low()` into a buffer of its own, then repeated into
    the output, before the other parts (`plans[1:]` on `getters`) add into it."""
    if factors is None:
        return onednn_conv.build_sum(plans, getters, get_other, out)
    cl, dtype = torch.channels_last, plans[0].weight.dtype
    low_out = onednn_conv.geometry(plans[0])[3]
    small = torch.empty(low_out, dtype=dtype).contiguous(memory_format=cl)
    run_low = onednn_conv.build(plans[0], get_low, None, small)
    write = repeat_writer(factors)

    def before(y: torch.Tensor) -> None:
        write(run_low(), y)

    return onednn_conv.build_sum(plans[1:], getters, get_other, out, before)


def time_chain(
    plan: ConvPlan,
    lengths: list[int],
    deadline: float,
    up: tuple[int, list[int]] | None = None,
) -> dict[str, float]:
    """Best seconds per call of the concat's copies (part `up[0]` repeated by `up[1]`, a
    nearest upsample) plus `plan` (oneDNN's first implementation) and of the sum chain over
    parts of `lengths` channels, both writing one output, timed as `conv_choice.race` times
    kernels."""
    cl, dtype = torch.channels_last, plan.weight.dtype

    def filled(shape: list[int]) -> torch.Tensor:  # (oneDNN's time does not depend on values)
        return torch.empty(shape, dtype=dtype, memory_format=cl).fill_(0.5)

    n, _, h, w = plan.x_lens
    k_up, factors = up if up is not None else (-1, None)
    xs = [
        filled([n, c, h // factors[0], w // factors[1]] if k == k_up and factors else [n, c, h, w])
        for k, c in enumerate(lengths)
    ]
    cat, out = filled(plan.x_lens), filled(onednn_conv.geometry(plan)[3])
    whole = onednn_conv.build(replace(plan, impl=None), lambda: cat, None, out)
    copies = list(zip(cat.split(lengths, 1), xs, strict=True))
    repeat = repeat_writer(factors) if factors else None

    def concat_then_conv() -> torch.Tensor:
        for k, (window, x) in enumerate(copies):
            if k == k_up and repeat is not None:
                repeat(x, window)
            else:
                window.copy_(x)
        return whole()

    getters = [lambda x=x: x for k, x in enumerate(xs) if k != k_up]
    plans = part_plans(plan, lengths, None, up)
    chain = up_chain(plans, lambda: xs[k_up], getters, None, out, factors)
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
    if epi is not None and epi.bias.any():  # oneDNN takes the bias in the input's type, or
        dtype = torch_dtype(conv.shape.dtype())  # float32 for a bf16 layer whose bias kept its
        if user is not None and wide_bias(user, conv):  # float32 value (`fuse_group`'s rule)
            dtype = torch.float32
        plan.bias = torch.from_numpy(epi.bias).to(dtype)
    up = ctx.producers.get(id(concat))  # a deferred upsample part
    up_index = _up_index(ctx, concat)
    saved, ctx.steps = ctx.steps, []
    if up is not None:
        lower_resize_alone(ctx, up)
    lower_concat(ctx, concat)
    lower_twin(ctx, conv)
    if user is not None and not lower_pointwise(ctx, user):
        lower_fallback(ctx, user)
    unfused, ctx.steps = ctx.steps, saved
    last = user or conv
    unfused_stores(ctx, unfused, ctx.index[id(last)])
    parts = concat_parts(ctx, concat, 1)
    lengths = [length for _, _, length in parts]
    plans = part_plans(plan, lengths, epi, up_index)
    state = choice_state(ctx.options, ctx.cache)
    for p in plans:  # oneDNN's fastest implementation of each part's convolution
        choose_impl(state, p)
    env = ctx.env
    k_up, factors = up_index if up_index is not None else (-1, None)
    getters = [part_reader(env, 1, p) for k, p in enumerate(parts) if k != k_up]
    reads = list(concat.inputs)
    low = -1
    if up is not None:
        low = ctx.arg(up, 0)
        reads.append(up.inputs[0])
    get_other = None
    if epi is not None and epi.other is not None:
        o = ctx.index[id(epi.other)]
        get_other, reads = (lambda: env[o]), [*reads, epi.other]

    def build(out: torch.Tensor | None):  # noqa: ANN202
        if out is not None:  # (tests: the chain writes the slot itself, nothing copied)
            ctx.cache["conv_concat_into_slot"] = ctx.cache.get("conv_concat_into_slot", 0) + 1
        return up_chain(plans, lambda: env[low], getters, get_other, out, factors)

    covered = [*([up] if up is not None else []), concat, conv, *([user] if user else [])]
    emit_fused(ctx, covered, unfused, build, reads)
    ctx.cache["conv_concat_sum"] = ctx.cache.get("conv_concat_sum", 0) + 1


__all__ = [
    "MODE_ENV",
    "ConcatSumError",
    "lower_concat_or_sum",
    "lower_resize_or_sum",
    "part_plans",
    "sum_conv",
    "sum_reader",
    "time_chain",
    "up_chain",
    "up_part",
]
