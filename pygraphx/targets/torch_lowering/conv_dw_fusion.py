"""A 1x1 convolution and the depthwise 3x3 one after it as one oneDNN primitive (CPU, `dnnl`).

An inverted-residual block (MobileNetV2) expands its input with a 1x1 convolution (bias, clip)
and filters the expanded tensor with a depthwise 3x3 one (bias, clip). Run as two steps, the
expanded tensor (6x the block's channels) is written to memory and read back; oneDNN's
depthwise post-op (`dnnl_post_ops_append_dw`) computes the 1x1 convolution a few rows at a
time and the depthwise one on those rows while they are in the cache, so the expanded tensor
never leaves it. Measured on the 2-core EPYC (1 thread, process CPU, the pair alone): 16x112x112
-> 96, stride 2, batch 1: 0.59 -> 0.52 ms; at batch 8 the six pairs oneDNN fuses natively take
13.4 ms instead of 21.6 (`benchmarks/mnv2dw_pairs.py`).

The pattern, in the program after the cpu target's passes:

    conv1x1 -> pointwise(act(conv + constants)) -> conv3x3 depthwise -> pointwise(act(...))

with a 1x1 convolution of stride 1 and no padding, one group; a depthwise convolution of a
3x3 kernel, as many groups as channels, stride 1 or 2 on both axes, one pixel of padding on
every side; each convolution the only user of its input (the first group's result is read by
the depthwise convolution alone), both float32 or both bf16 (on a CPU with bf16 instructions:
`onednn_conv.supports`), no add operand in either epilogue.

The pair is fused only where oneDNN runs it as one kernel (`jit_1x1:...` at the thread count
the program is prepared for; oneDNN 3.2 does so where the expanded tensor is larger than twice
the L2 cache of the threads, 1 MiB a core on the EPYC: at batch 1 only MobileNetV2's 16x112x112
-> 96 pair, at batch 8 13 of its 16 pairs at 1 thread, 6 at 2). oneDNN also offers every such
pair as `ref_fused_convolution`, two primitives one after the other inside one call, no faster
than the two steps (measured), so those pairs stay two steps. A primitive made later for
another thread count may come out as `ref_fused_convolution`; it computes the same values and
says so once (`onednn_conv`).
`PGX_CONV_DW_FUSION=off` (or the lowering option `conv_dw_fusion=False`) turns the fusion off.

This module matches the pattern (`dw_pair`, and `fused_user`: a convolution's epilogue group)
and asks oneDNN (`native`); `conv_fusion` lowers it: the first convolution's step is deferred
into its group as usual (`fuse_group`); there, when `dw_pair` matches, the group is deferred
into the depthwise convolution and that into its group, which emits one step for the four
instructions (the unfused twins of both pairs kept for profiling). Where a later deferral
fails, the first pair's step is emitted then and the depthwise convolution lowered as usual.
The memory plan keeps the first convolution's input live to the last group (`dw_reader`, part
of the cpu target's `fused_reads`), so the step never writes over what it reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.settings import env_choice
from pygraphx.targets.torch_lowering import input_convert, native_mbconv, native_mbhead, onednn_conv
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan

ENV = "PGX_CONV_DW_FUSION"
MODES = ("on", "off")


def enabled(options: dict) -> bool:
    """Whether the fusion is on: the lowering option `conv_dw_fusion`, else `PGX_CONV_DW_FUSION`
    (on by default)."""
    if "conv_dw_fusion" in options:
        return bool(options["conv_dw_fusion"])
    return env_choice(ENV, MODES, "on", lower=True) == "on"


def dw_pair(conv: Instruction) -> tuple[Instruction, Instruction, Instruction] | None:
    """(its group, the depthwise convolution, that one's group) when `conv` is the 1x1 head of
    a pair this module fuses (see the module docstring), else None."""
    group = fused_user(conv)
    if group is None or _dtype(conv) is None or not _is_1x1(conv) or len(group.outputs) != 1:
        return None
    dw = group.outputs[0]
    if dw.op.name != "convolution" or dw.inputs[0] is not group or not _is_dw3x3(dw):
        return None
    if _dtype(dw) != _dtype(conv):
        return None
    last = fused_user(dw)
    return None if last is None else (group, dw, last)


def fused_user(ins: Instruction) -> Instruction | None:
    """The pointwise group a convolution `ins` may be fused into (its step then reads the
    convolution's input while it writes the group's result), else None: the memory plan's
    `fused_reads` with `conv_output="arena"` (the cpu target), so the group's arena slot is
    never the input's memory and the `dnnl` kernel can write it directly."""
    if ins.op.name != "convolution" or len(ins.outputs) != 1:
        return None
    user = ins.outputs[0]
    return user if may_fuse(ins, user) else None


def may_fuse(conv: Instruction, user: Instruction) -> bool:
    """Whether `user` is a pointwise group of `conv`'s shape and type reading it once."""
    return (
        user.op.name == "pointwise"
        and user.shape.type() == conv.shape.type()
        and user.shape.lens() == conv.shape.lens()
        and sum(1 for i in user.inputs if i is conv) == 1
    )


def dw_reader(ins: Instruction) -> Instruction | None:
    """The last group of the pair or native block `ins` heads (its step reads `ins`'s input
    while it writes that group's slot), else None: part of the cpu target's `fused_reads`."""
    if ins.op.name != "convolution":
        return None
    block = native_block(ins)
    if block is not None:
        return block.last
    head = native_head(ins)
    if head is not None:
        return head.last
    pair = dw_pair(ins)
    return None if pair is None else pair[2]


@dataclass
class Block:
    """An inverted-residual block the native kernel runs (`native_mbconv`): the expansion
    and its group (None, None where the block has none), the depthwise convolution and its
    group, the projection and its group (whose step computes all of them)."""

    expand: Instruction | None
    g1: Instruction | None
    dw: Instruction
    g2: Instruction
    proj: Instruction
    last: Instruction
    #: mnv15: 0, or the stride of the 3x3 convolution that is the expansion (`_is_stem`)
    stem: int = 0
    #: mnv18: a bf16 stem's input, the convert of the float32 image (the step reads the image)
    convert: Instruction | None = None

    @property
    def head(self) -> Instruction:
        return self.dw if self.expand is None else self.expand

    @property
    def source(self) -> Instruction:
        """The value the block's step reads: the head's input (a bf16 stem's: the image)."""
        return self.head.inputs[0] if self.convert is None else self.convert.inputs[0]

    def instructions(self) -> list[Instruction]:
        first = [] if self.expand is None else [self.expand, self.g1]
        if self.convert is not None:
            first.insert(0, self.convert)
        return [*first, self.dw, self.g2, self.proj, self.last]


def native_block(head: Instruction) -> Block | None:
    """The block `head` starts when the native kernel takes it, else None: a float32 (or bf16:
    `native_mbconv.bf16_available`, its groups bf16 too) 1x1 convolution (stride 1, no
    padding, one group) with its group, a depthwise 3x3 one (stride 1 or 2, padding 1) with
    its group, a 1x1 projection with its group, each convolution the only user of its input
    and of a literal weight; or the same without the expansion (a depthwise convolution whose
    input is no 1x1 convolution's group); the kernel on (`native_mbconv.available`) and its
    rule saying yes at the thread count the program is prepared for
    (`native_mbconv.use_native`)."""
    kind = _dtype(head) if head.op.name == "convolution" else None
    if kind not in ("float_type", "bf16_type"):
        return None  # (bfmb16: bf16 blocks where the bf16 kernel is on and built: below)
    if not head.inputs[1].is_literal():
        return None
    expand = g1 = None
    stem = head.op.stride[0] if _is_stem(head) else 0
    if _is_1x1(head) or stem:
        g1 = fused_user(head)
        if g1 is None or len(g1.outputs) != 1:
            return None
        expand, dw = head, g1.outputs[0]
        if dw.op.name != "convolution" or dw.inputs[0] is not g1 or not _is_dw3x3(dw):
            return None
    elif _is_dw3x3(head):
        dw, src = head, head.inputs[0]
        if src.op.name == "pointwise" and any(
            i.op.name == "convolution" and _is_1x1(i) and fused_user(i) is src
            for i in src.inputs
        ):
            return None  # (the block of that expansion, or the oneDNN route)
        # (after a stem: where the stem's block is taken it defers this convolution, which is
        # then never asked about; where it is not (the stem's output is also the residual, or
        # its activation is no clip form: MobileNetV3's first block) this block is the kernel's)
    else:
        return None
    if _dtype(dw) != kind or (g1 is not None and g1.shape.type() != kind):
        return None
    g2 = fused_user(dw)
    if g2 is None or len(g2.outputs) != 1:
        return None
    proj = g2.outputs[0]
    if proj.op.name != "convolution" or proj.inputs[0] is not g2 or _dtype(proj) != kind:
        return None
    if not _is_1x1(proj) or not proj.inputs[1].is_literal():
        return None
    last = fused_user(proj)
    if last is None or g2.shape.type() != kind or last.shape.type() != kind:
        return None
    n, c, h, w = head.inputs[0].shape.lens()
    if stem:  # (the block's map is the stem's output)
        h, w = dw.inputs[0].shape.lens()[2:]
    m, k = dw.shape.lens()[1], proj.shape.lens()[1]
    stride = dw.op.stride[0]
    bf16, has_expand = kind == "bf16_type", expand is not None
    if bf16 and not native_mbconv.bf16_available():  # (asked once the block's shape matched)
        return None
    if not native_mbconv.use_native(n, c, h, w, m, k, stride, bf16, has_expand):
        return None
    convert = head.inputs[0] if stem and bf16 else None
    return Block(expand, g1, dw, g2, proj, last, stem, convert)


@dataclass
class Head:
    """A network's head the native kernel runs (`native_mbhead`, mnv15): a 1x1 convolution,
    its group, an average pooling over the whole map; then, or not (None), a flatten (or
    reshape) to (N, C) and a `dot` with a literal weight (whose step computes all of them)."""

    conv: Instruction
    group: Instruction
    pool: Instruction
    flat: Instruction | None
    dot: Instruction | None
    #: mnv16: the `dot`'s only user where it is a group adding it and one other value (the
    #: classifier's bias, when that is a constant per column: `conv_native` reads it)
    bias: Instruction | None = None
    #: mnv18: a bf16 head's `dot`'s only user where it is a lone convert to float32
    widen: Instruction | None = None

    @property
    def bf16(self) -> bool:
        return self.conv.shape.type() == "bf16_type"

    @property
    def last(self) -> Instruction:
        if self.dot is None:
            return self.pool
        if self.widen is not None:
            return self.widen
        return self.dot if self.bias is None else self.bias

    def instructions(self) -> list[Instruction]:
        rest = [] if self.dot is None else [self.flat, self.dot]
        rest += [] if self.bias is None else [self.bias]
        rest += [] if self.widen is None else [self.widen]
        return [self.conv, self.group, self.pool, *rest]


def native_head(conv: Instruction) -> Head | None:
    """The head `conv` starts when the native kernel takes it, else None: a float32 1x1
    convolution (stride 1, no padding, one group) of a literal weight whose group is its only
    user, the group's only user an average pooling over the whole map without padding; then,
    where the pooling's only user is a flatten / reshape to (N, C) whose only user is a float32
    `dot` of it (first) and a literal (C, K) weight, those two too; the kernel on
    (`native_mbhead.available`). mnv18: or all of them bf16 (`native_mbhead.bf16_available`),
    the `dot`'s only user, where it is a lone convert to float32, too (no classifier bias)."""
    kind = _dtype(conv) if conv.op.name == "convolution" else None
    if kind not in ("float_type", "bf16_type") or not _is_1x1(conv):
        return None
    if not conv.inputs[1].is_literal() or len(conv.outputs) != 1:
        return None
    group = fused_user(conv)
    if group is None or len(group.outputs) != 1:
        return None
    pool = group.outputs[0]
    if pool.op.name != "pooling" or pool.op.mode != "average" or pool.inputs[0] is not group:
        return None
    lens = list(group.shape.lens())
    whole = list(pool.op.lengths) == lens[2:] and not any(pool.op.padding)
    if not (pool.op.global_ or whole) or list(pool.shape.lens()) != lens[:2] + [1, 1]:
        return None
    if group.shape.type() != kind or pool.shape.type() != kind:
        return None
    if not (native_mbhead.available() if kind == "float_type" else native_mbhead.bf16_available()):
        return None
    flat = dot = None
    if len(pool.outputs) == 1 and pool.outputs[0].op.name in ("flatten", "reshape"):
        f = pool.outputs[0]
        d = f.outputs[0] if len(f.outputs) == 1 else None
        if (
            list(f.shape.lens()) == lens[:2]
            and d is not None
            and d.op.name == "dot"
            and len(d.inputs) == 2
            and d.inputs[0] is f
            and d.inputs[1].is_literal()
            and d.inputs[1].shape.ndim() == 2
            and d.inputs[1].shape.lens()[0] == lens[1]
            and d.shape.type() == kind
            and d.inputs[1].shape.type() == kind
        ):
            flat, dot = f, d
    if kind == "bf16_type":
        return Head(conv, group, pool, flat, dot, None, None if dot is None else _widen(dot))
    bias = None if dot is None or not native_mbhead.BIAS else _bias_group(dot)
    return Head(conv, group, pool, flat, dot, bias)


def _widen(dot: Instruction) -> Instruction | None:
    """mnv18: a bf16 `dot`'s only user where it is a pointwise group converting it (alone) to
    float32, else None."""
    if len(dot.outputs) != 1:
        return None
    user = dot.outputs[0]
    if user.op.name != "pointwise" or len(user.inputs) != 1 or user.inputs[0] is not dot:
        return None
    if user.shape.type() != "float_type" or list(user.shape.lens()) != list(dot.shape.lens()):
        return None
    body = [i for i in user.module_inputs[0].instructions
            if not (i.is_param() or i.is_literal() or i.op.name.startswith("@"))]  # fmt: skip
    if len(body) != 1 or body[0].op.name != "convert":
        return None
    return user if getattr(body[0].op, "target_type", None) == "float_type" else None


def _bias_group(dot: Instruction) -> Instruction | None:
    """`dot`'s only user where it is a pointwise group of `dot`'s shape and type whose body is
    one `add` of its two inputs, `dot` and a literal (or a broadcast view of one), else None."""
    if len(dot.outputs) != 1:
        return None
    group = dot.outputs[0]
    if group.op.name != "pointwise" or len(group.inputs) != 2 or dot not in group.inputs:
        return None
    if group.shape.type() != dot.shape.type() or group.shape.lens() != dot.shape.lens():
        return None
    other = group.inputs[1] if group.inputs[0] is dot else group.inputs[0]
    while not other.is_literal() and other.op.name in ("multibroadcast", "broadcast"):
        other = other.inputs[0]
    if other is dot or not other.is_literal():
        return None
    body = group.module_inputs[0]
    ops = [i for i in body.instructions if i.op.name not in ("@param", "@return")]
    params = body.get_parameters()
    if len(params) != 2 or len(ops) != 1 or ops[0].op.name != "add":
        return None
    return group if {id(i) for i in ops[0].inputs} == {id(i) for i in params} else None


def block_ending(last: Instruction) -> Block | None:
    """The native block whose last group is `last`, else None (the memory plan's residual
    slots: `conv_residual`)."""
    if last.op.name != "pointwise":
        return None
    proj = _fused_input(last)
    g2 = None if proj is None else proj.inputs[0]
    dw = None if g2 is None or g2.op.name != "pointwise" else _fused_input(g2)
    if dw is None:
        return None
    heads = [dw]
    g1 = dw.inputs[0]
    if g1.op.name == "pointwise":
        expand = _fused_input(g1)
        if expand is not None:
            heads.insert(0, expand)
    for head in heads:
        block = native_block(head)
        if block is not None and block.last is last:
            return block
    return None


def _fused_input(group: Instruction) -> Instruction | None:
    """The convolution among `group`'s inputs whose fused group it is, else None."""
    for i in group.inputs:
        if i.op.name == "convolution" and fused_user(i) is group:
            return i
    return None


def _dtype(conv: Instruction) -> str | None:
    """The type of a float32 or bf16 convolution's input and weight (the same), else None."""
    types = {i.shape.type() for i in conv.inputs}
    if len(conv.inputs) != 2 or len(types) != 1:
        return None
    kind = types.pop()
    return kind if kind in ("float_type", "bf16_type") else None


def _is_1x1(conv: Instruction) -> bool:
    op, (x, w) = conv.op, (i.shape.lens() for i in conv.inputs)
    begin, end = op.pads(x, w)
    return (
        len(w) == 4 and list(w[2:]) == [1, 1] and op.group == 1
        and all(s == 1 for s in op.stride) and all(d == 1 for d in op.dilation)
        and not any(begin) and not any(end)
    )  # fmt: skip


#: a stem (`_is_stem`) has at most this many input channels (the kernel's product over 9 C
#: inputs a pixel is meant for an image's few channels)
STEM_MAX_CIN = 4


def _is_stem(conv: Instruction) -> bool:
    """mnv15: whether `conv` is a network's first convolution the native block kernel takes as
    its expansion (`native_mbconv.MbConv`'s `stem`): float32 (or, mnv18, bf16 of the float32
    image's convert: `_image_convert`), a literal 3x3 weight of at most
    `STEM_MAX_CIN` input channels, one group, stride 1 or 2 on both axes, padding 1 on every
    side; the switch `PGX_CPU_NATIVE_MBSTEM` on."""
    if conv.op.name != "convolution" or len(conv.inputs) != 2 or not conv.inputs[1].is_literal():
        return False
    op, (x, w) = conv.op, (i.shape.lens() for i in conv.inputs)
    if len(w) != 4 or list(w[2:]) != [3, 3] or op.group != 1 or x[1] > STEM_MAX_CIN:
        return False
    begin, end = op.pads(x, w)
    kind = _dtype(conv)
    return (
        (kind == "float_type" or (kind == "bf16_type" and _image_convert(conv)))
        and op.stride[0] == op.stride[1] and op.stride[0] in (1, 2)
        and all(d == 1 for d in op.dilation)
        and list(begin) == [1, 1] and list(end) == [1, 1]
        and native_mbconv.stem_enabled()
    )  # fmt: skip


def _image_convert(conv: Instruction) -> bool:
    """mnv18: whether a bf16 convolution's input is a lone convert (float32 -> bf16) of a
    float32 program parameter (the image: never an arena slot the plan could reuse while the
    block's step reads it), the convolution its only user; the switch
    `PGX_CPU_NATIVE_MBSTEM_BF16` on (the stem then reads the image, `native_mbconv.MbConv`)."""
    conv_in = conv.inputs[0]
    if conv_in.op.name not in ("pointwise", "convert") or len(conv_in.inputs) != 1:
        return False
    image = conv_in.inputs[0]
    return (
        image.is_param() and image.shape.type() == "float_type"
        and len(conv_in.outputs) == 1 and conv_in.outputs[0] is conv
        and input_convert.lone_convert(conv_in)
        and native_mbconv.stem_bf16_enabled()
    )  # fmt: skip


def _is_dw3x3(conv: Instruction) -> bool:
    op, (x, w) = conv.op, (i.shape.lens() for i in conv.inputs)
    begin, end = op.pads(x, w)
    return (
        conv.inputs[1].is_literal()
        and len(w) == 4 and list(w[1:]) == [1, 3, 3] and op.group == x[1] == w[0]
        and op.stride[0] == op.stride[1] and op.stride[0] in (1, 2)
        and all(d == 1 for d in op.dilation)
        and list(begin) == [1, 1] and list(end) == [1, 1]
    )  # fmt: skip


def native(plan: ConvPlan, dw: Instruction) -> bool:
    """Whether oneDNN runs `plan` with the depthwise convolution `dw` fused as one kernel at
    this thread count (the weights' values do not matter to its choice)."""
    if not onednn_conv.available():
        return False
    x, w = (list(i.shape.lens()) for i in dw.inputs)
    dtype = plan.weight.dtype
    probe = ConvPlan(torch.zeros(w, dtype=dtype), plan.packed, x, [1, 1], list(dw.op.stride),
                     [1, 1], w[0], None, torch.zeros(w[0], dtype=dtype))  # fmt: skip
    head = ConvPlan(plan.weight, plan.packed, plan.x_lens, plan.padding, plan.stride,
                    plan.dilation, plan.groups, None, plan.bias, plan.unary, plan.scalars,
                    dw=probe)  # fmt: skip
    if not onednn_conv.supports(head):  # (bf16 without the CPU's bf16 instructions)
        return False
    return not onednn_conv.first_implementation(head).startswith("ref")


__all__ = [
    "ENV", "Block", "Head", "dw_pair", "dw_reader", "enabled", "fused_user", "may_fuse",
    "native", "block_ending", "native_block", "native_head",
]  # fmt: skip
