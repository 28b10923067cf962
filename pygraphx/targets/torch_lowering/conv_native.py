"""MobileNet-style inverted-residual blocks and a network's head as native steps (issue 10):
the lowering glue of `native_mbconv` (mbv14) and `native_mbhead` (mnv15).

`conv_fusion.fuse_group` asks `defer_head` and `defer_block` first for a convolution deferred
into its group (no add operand). A block (`conv_dw_fusion.native_block`: [stem or 1x1 expand +
group], depthwise + group, 1x1 projection + group, with or without a residual) has its step
deferred from group to group to the last one, where `_emit_block` emits one step on
`native_mbconv.MbConv` for its six (four without an expansion) instructions; a head
(`conv_dw_fusion.native_head`: 1x1 + group + global average pooling [+ flatten + `dot`]) is
deferred to the pooling or the `dot`, where `_emit_head` emits one step on
`native_mbhead.MbHead`. Where a later stage cannot be deferred or matched, the steps so far
are emitted as usual (the block's `fuse` callback: `fuse_group`) and the rest is lowered as
usual. Every fused step keeps its unfused twins for profiling. Split out of `conv_fusion.py`
(mnv16); the pieces both use are in `conv_steps.py`, below both.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.context import LoweringContext, LoweringError, Step
from pygraphx.targets.torch_lowering.conv_dw_fusion import Block, Head, native_block, native_head
from pygraphx.targets.torch_lowering.conv_epilogue_match import (
    Epilogue,
    match_epilogue,
    wide_bias,
)
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan
from pygraphx.targets.torch_lowering.conv_steps import (
    emit_fused,
    lower_group,
    twin_steps,
    unfused_stores,
)
from pygraphx.targets.torch_lowering.fallback import lower_fallback
from pygraphx.targets.torch_lowering.lower_views import lower_view
from pygraphx.targets.torch_lowering.native_mbconv import MbConv, bounds, program_scratch
from pygraphx.targets.torch_lowering.native_mbhead import MbHead
from pygraphx.targets.torch_lowering.registry import LOWERINGS, Fuser, defer

CL = torch.channels_last

# --- an inverted-residual block on the native kernel (`native_mbconv`, mbv14) ----------------


def defer_block(
    ctx: LoweringContext,
    conv: Instruction,
    group: Instruction,
    plan: ConvPlan,
    unfused: list[Step],
    emit_head: Callable[[], None],
    fuse: Fuser,
) -> bool:
    """Called by `conv_fusion.fuse_group` (passed as `fuse`) with a convolution `conv`
    deferred into its group `group` (the epilogue in `plan`, no add operand): True when `conv`
    heads a block the native kernel runs (`conv_dw_fusion.native_block`) and its step is
    deferred to the block's last group (one step for the block's six or four instructions);
    False when the caller emits its own step now. Where a later stage cannot be deferred or
    matched, the steps so far are emitted as usual and the rest of the block is lowered as
    usual (its groups by `fuse`)."""
    block = native_block(conv)
    if block is None or (block.g1 if block.expand is not None else block.g2) is not group:
        return False
    try:
        bounds(plan.unary, plan.scalars)
    except ValueError:
        return False
    head = {"plan": plan, "twins": list(unfused), "emit": [emit_head]}

    def undo() -> None:
        for fn in head["emit"]:
            fn()

    def at_dw(ctx: LoweringContext, ins: Instruction) -> bool:
        if defer(ctx, block.dw, block.g2, at_g2):
            return True
        undo()
        return False

    def at_g2(ctx: LoweringContext, ins: Instruction) -> bool:
        epi = match_epilogue(ctx, block.dw, block.g2)
        if epi is None or epi.other is not None or not _clip_form(epi):
            undo()
            return fuse(ctx, block.g2)
        head["dw_epi"] = epi

        def emit_g2() -> None:
            ctx.deferred.discard(id(block.g2))
            if not fuse(ctx, block.g2):
                lower_group(ctx, block.g2)

        head["emit"].append(emit_g2)
        if defer(ctx, block.g2, block.proj, at_proj):
            return True
        head["emit"].pop()
        undo()
        return fuse(ctx, block.g2)

    def at_proj(ctx: LoweringContext, ins: Instruction) -> bool:
        if defer(ctx, block.proj, block.last, at_last):
            return True
        undo()
        return False

    def at_last(ctx: LoweringContext, ins: Instruction) -> bool:
        epi = match_epilogue(ctx, block.proj, block.last)
        if epi is None or not _clip_form(epi):
            undo()
            return fuse(ctx, block.last)
        _emit_block(ctx, block, head, epi)
        return True

    if block.expand is None:  # the head is the depthwise convolution, `group` its group
        head["dw_epi"] = Epilogue(np.zeros(0), None, plan.unary, plan.scalars)
        head["dw_bias"] = plan.bias
        return defer(ctx, block.g2, block.proj, at_proj)
    return defer(ctx, block.g1, block.dw, at_dw)


def _clip_form(epi: Epilogue) -> bool:
    """Whether the kernel runs the epilogue's activation (none, relu, clip) in its order."""
    return not epi.add_after and epi.unary in ("none", "relu", "hardtanh")


def _emit_block(ctx: LoweringContext, block: Block, head: dict, epi: Epilogue) -> None:
    """One step for the whole block on the native kernel (`native_mbconv.MbConv`); the
    unfused twins of its two or three convolution pairs kept for profiling."""
    plan: ConvPlan = head["plan"]
    dw_epi: Epilogue = head["dw_epi"]
    twins = list(head["twins"])
    if block.expand is not None:
        twins += twin_steps(ctx, block.dw, block.g2)
        we, be = plan.weight, plan.bias
        dw_bias = torch.from_numpy(dw_epi.bias) if dw_epi.bias.any() else None
        acts = [(plan.unary, plan.scalars), (dw_epi.unary, dw_epi.scalars)]
    else:
        we = be = None
        dw_bias = head["dw_bias"]
        acts = [("none", []), (plan.unary, plan.scalars)]
    twins += twin_steps(ctx, block.proj, block.last)
    acts.append((epi.unary, epi.scalars))
    wd = ctx.constant(ctx.arg(block.dw, 1))
    wp = ctx.constant(ctx.arg(block.proj, 1))
    bp = torch.from_numpy(epi.bias) if epi.bias.any() else None
    bf16 = wp.dtype == torch.bfloat16
    if bf16:  # (bfmb16) a bf16 layer's bias rounded to bf16 as the oneDNN route's, or float32
        if block.expand is not None:  # where the program kept it (`wide_bias`)
            dw_bias = _layer_bias(dw_bias, block.g2, block.dw)
        bp = _layer_bias(bp, block.last, block.proj)
    x_lens = list(block.head.inputs[0].shape.lens())
    mb = MbConv(we, be, wd, dw_bias, wp, bp, block.dw.op.stride[0], acts, x_lens,
                residual=epi.other is not None, scratch=program_scratch(ctx.cache),
                stem=block.stem, bf16=bf16)  # fmt: skip
    env, xi = ctx.env, ctx.arg(block.head, 0)
    if block.convert is not None:  # mnv18: a bf16 stem reads the float32 image
        twins = _take_step(ctx, block.convert) + twins
        xi = ctx.arg(block.convert, 0)
    ri = None if epi.other is None else ctx.index[id(epi.other)]
    reads = [block.source] + ([] if epi.other is None else [epi.other])

    def build(out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        if out is not None and (not out.is_contiguous(memory_format=CL) or out.dtype != mb.dtype):
            out = None
        return mb.closure(env, xi, ri, out)

    emit_fused(ctx, block.instructions(), twins, build, reads)
    ctx.cache["native_mbconv"] = ctx.cache.get("native_mbconv", 0) + 1  # (tests, benchmarks)


def _take_step(ctx: LoweringContext, ins: Instruction) -> list[Step]:
    """mnv18: the step computing `ins` alone (a bf16 stem's image convert, lowered before the
    block was matched) taken out of the program's steps: it becomes the block step's first
    unfused twin (the block's kernel converts as it reads the image)."""
    for k in range(len(ctx.steps) - 1, -1, -1):
        if len(ctx.steps[k].instructions) == 1 and ctx.steps[k].instructions[0] is ins:
            step = ctx.steps.pop(k)
            if hasattr(step.fn, "reorders"):  # an `input_convert` reorder step: it no longer runs
                ctx.cache["input_convert"] = ctx.cache.get("input_convert", 1) - 1
            return [step]
    raise LoweringError(f"native mbconv: no step of its own computes the stem's {ins.op}")


def _layer_bias(
    bias: torch.Tensor | None, group: Instruction, conv: Instruction
) -> torch.Tensor | None:
    """A bf16 convolution's bias as its oneDNN step takes it (`conv_fusion.fuse_group`):
    rounded to bf16, unless the program kept it float32 (`wide_bias`); as float32."""
    if bias is None or wide_bias(group, conv):
        return bias
    return bias.to(torch.bfloat16).float()


# --- a network's head on the native kernel (`native_mbhead`, mnv15) --------------------------


def defer_head(
    ctx: LoweringContext, conv: Instruction, group: Instruction, plan: ConvPlan,
    unfused: list[Step],
) -> bool:  # fmt: skip
    """Called by `conv_fusion.fuse_group` with a convolution `conv` deferred into its group
    `group` (the epilogue in `plan`, no add operand): True when `conv` heads a network's head
    the native kernel runs (`conv_dw_fusion.native_head`) and its step is deferred to the
    pooling (and on to the classifier's `dot` where there is one): one step for all of them."""
    head = native_head(conv)
    if head is None or head.group is not group or plan.add_after:
        return False
    try:
        lo, hi = bounds(plan.unary, plan.scalars)
    except ValueError:
        return False

    def at_pool(ctx: LoweringContext, ins: Instruction) -> bool:
        if head.dot is not None and defer(ctx, head.pool, head.dot, at_dot):
            ctx.fusers[id(head.flat)] = _in_head_step
            return True
        _emit_head(ctx, head, plan, unfused, (lo, hi), with_dot=False)
        return True

    def at_dot(ctx: LoweringContext, ins: Instruction) -> bool:
        if head.bias is not None and defer(ctx, head.dot, head.bias, at_bias):
            return True
        if head.widen is not None and defer(ctx, head.dot, head.widen, at_widen):
            return True
        _emit_head(ctx, head, plan, unfused, (lo, hi), with_dot=True)
        return True

    def at_widen(ctx: LoweringContext, ins: Instruction) -> bool:  # (mnv18, bf16)
        _emit_head(ctx, head, plan, unfused, (lo, hi), with_dot=True, widen=True)
        return True

    def at_bias(ctx: LoweringContext, ins: Instruction) -> bool:
        # (the bias literal is lowered by now, not yet at the `dot`)
        bc = _bias_vector(ctx, head)
        _emit_head(ctx, head, plan, unfused, (lo, hi), with_dot=True, bc=bc)
        if bc is None:  # not a constant per column: the group its own step after the head's
            assert head.bias is not None
            lower_group(ctx, head.bias)
        return True

    return defer(ctx, group, head.pool, at_pool)


def _in_head_step(ctx: LoweringContext, ins: Instruction) -> bool:
    """The flatten between a head's pooling and its `dot`: lowered (as the twin it is) by the
    head's step at the `dot` (`_emit_head`), no step of its own here."""
    return True


def _bias_vector(ctx: LoweringContext, head: Head) -> torch.Tensor | None:
    """The classifier's bias the group `head.bias` adds to the `dot`, as a (K,) float32
    tensor, when it is a float32 constant equal in every row; else None (its own step)."""
    assert head.dot is not None and head.bias is not None
    group, dot = head.bias, head.dot
    t = ctx.constant(ctx.arg(group, 1 if group.inputs[0] is dot else 0))
    if t is None or t.dtype != torch.float32 or list(t.shape) != list(dot.shape.lens()):
        return None
    vec = t[0]
    if t.shape[0] > 1 and t.stride(0) != 0 and not torch.equal(t, vec.expand_as(t)):
        return None
    return vec.contiguous()


def _emit_head(
    ctx: LoweringContext, head: Head, plan: ConvPlan, unfused: list[Step],
    bounds: tuple[float, float], with_dot: bool, bc: torch.Tensor | None = None,
    widen: bool = False,
) -> None:  # fmt: skip
    """One step for the head on the native kernel (`native_mbhead.MbHead`); the unfused twins
    (the convolution and its group, the pooling, the flatten and the `dot`, and the bias
    group where `bc`, the classifier's bias, is given, or a bf16 head's convert to float32
    after the `dot` where `widen`) kept for profiling."""
    saved, ctx.steps = ctx.steps, []
    if not LOWERINGS["pooling"](ctx, head.pool):  # (lower_nn's, registered)
        lower_fallback(ctx, head.pool)
    instructions = [head.conv, head.group, head.pool]
    wc = None
    if with_dot:
        assert head.flat is not None and head.dot is not None
        lower_view(ctx, head.flat)
        # a program output: a new tensor each run, which the run hands out as it is (an arena
        # slot would be copied out: 60 us a MobileNetV2 b1 run, the run's Python cold then)
        _dot_twin(ctx, head.dot, fresh=bc is None and _returned(head.dot))
        wc = ctx.constant(ctx.arg(head.dot, 1))
        instructions += [head.flat, head.dot]
        if bc is not None:
            assert head.bias is not None
            _bias_twin(ctx, head.bias, head.dot, bc, fresh=_returned(head.bias))
            instructions.append(head.bias)
        if widen:
            assert head.widen is not None
            _widen_twin(ctx, head.widen, head.dot, fresh=_returned(head.widen))
            instructions.append(head.widen)
    twins, ctx.steps = list(unfused) + ctx.steps, saved
    last = instructions[-1]
    uidx = ctx.index[id(last)]
    unfused_stores(ctx, twins, uidx)
    x_lens = list(head.conv.inputs[0].shape.lens())
    if head.bf16:  # mnv18: the weights bf16 as the program's, the bias as oneDNN took it
        out_dtype = torch.float32 if widen else torch.bfloat16
        mb = MbHead(plan.weight, plan.bias, bounds[0], bounds[1], wc, bc, x_lens, bf16=True,
                    out_dtype=out_dtype)  # fmt: skip
    else:
        mb = MbHead(plan.weight.float(), plan.bias, bounds[0], bounds[1], wc, bc, x_lens)
    env, xi = ctx.env, ctx.arg(head.conv, 0)

    def build(out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        if out is not None and (out.dtype != mb.out_dtype or (with_dot and out.stride(1) != 1)):
            out = None
        return mb.closure(env, xi, out)

    layout = ctx.layout[uidx]
    emit_fused(ctx, instructions, twins, build, [head.conv.inputs[0]])
    ctx.layout[uidx] = layout  # (a pooled (N, C, 1, 1) or (N, K) result: no channels-last map)
    ctx.cache["native_mbhead"] = ctx.cache.get("native_mbhead", 0) + 1  # (tests, benchmarks)


def _dot_twin(ctx: LoweringContext, dot: Instruction, fresh: bool) -> None:
    """The classifier's `dot` as a step of its own (a head's unfused twin, for profiling), into
    its arena slot, or (`fresh`, or no slot) a new tensor."""
    env = ctx.env
    a, b = ctx.arg(dot, 0), ctx.arg(dot, 1)
    idx, out = (ctx.bind_dynamic(dot), None) if fresh else ctx.output(dot)
    if out is not None:

        def step() -> None:
            torch.mm(env[a], env[b], out=out)

    else:

        def step() -> None:
            env[idx] = torch.mm(env[a], env[b])

    ctx.emit(step, dot, idx)


def _widen_twin(ctx: LoweringContext, widen: Instruction, dot: Instruction, fresh: bool) -> None:
    """A bf16 head's convert to float32 after the `dot` as a step of its own (the head's unfused
    twin, mnv18), into its arena slot, or (`fresh`, or no slot) a new tensor."""
    env = ctx.env
    d = ctx.index[id(dot)]
    idx, out = (ctx.bind_dynamic(widen), None) if fresh else ctx.output(widen)
    if out is not None:

        def step() -> None:
            out.copy_(env[d])

    else:

        def step() -> None:
            env[idx] = env[d].float()

    ctx.emit(step, widen, idx)


def _returned(ins: Instruction) -> bool:
    return any(o.is_return() for o in ins.outputs)


def _bias_twin(
    ctx: LoweringContext, group: Instruction, dot: Instruction, bc: torch.Tensor, fresh: bool
) -> None:
    """The classifier's bias group as a step of its own (a head's unfused twin): the `dot`'s
    result plus `bc`, into the group's arena slot, or (`fresh`, or no slot) a new tensor."""
    env = ctx.env
    d = ctx.index[id(dot)]
    idx, out = (ctx.bind_dynamic(group), None) if fresh else ctx.output(group)
    if out is not None:

        def step() -> None:
            torch.add(env[d], bc, out=out)

    else:

        def step() -> None:
            env[idx] = env[d] + bc

    ctx.emit(step, group, idx)
