"""oneDNN convolutions on the CPU, with their element-wise epilogue fused as post-ops.

A 2-D float32 (or, on a CPU with bf16 instructions, bf16) convolution whose weights are a
literal runs as
`mkldnn._convolution_pointwise` with the weights reordered into oneDNN's blocked format once,
at prepare, on channels-last activations (the first convolution converts its input; every later
one gets channels-last tensors from its producers). This is the path torch's own CPU compiler
(inductor with freezing) takes, and it is where most of a CNN's time goes.

When the convolution's only user is a `pointwise` group of the form

    act(conv + c1 + c2 + ... [+ other])     act in {none, relu, clip(0, 6)}

where each `c` is a constant broadcast along the channels (a bias) or a scalar, and `other` is
one full tensor (a residual, or a second branch's output), the group is folded into the
convolution: the constants are summed into one bias at prepare, `other` is a binary `add`
post-op and the activation a unary post-op, so the group costs no pass over memory of its own.
The convolution must come right before its user in the program (see `lower.defer`). Profiling
runs the convolution and the group as separate steps.

Where results live: oneDNN allocates each convolution's output; with `conv_output="torch"`
(the default) that tensor is the value (torch's CPU allocator reuses the memory of values
released after their last use), with `conv_output="arena"` it is copied into the arena slot the
memory plan gave it. The benchmark (`benchmarks/cpu_vs_peers.py --conv-output`) measures both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, LoweringContext
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.fallback import lower_fallback
from pygraphx.targets.torch_lowering.lower_gemm import bf16_gemm
from pygraphx.targets.torch_lowering.registry import (
    defer,
    deferred_producer,
    is_deferred,
    storing,
)
from pygraphx.targets.torch_lowering.store import store_result, torch_pad


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


@dataclass
class ConvPlan:
    """A convolution ready for oneDNN: packed weight, geometry, bias, and post-ops."""

    weight: torch.Tensor
    padding: list[int]
    stride: list[int]
    dilation: list[int]
    groups: int
    pre_pad: list[int] | None
    bias: torch.Tensor | None = None
    unary: str = "none"
    scalars: list[float] = field(default_factory=list)
    other: int | None = None  # env index of the binary add operand


def conv_plan(ctx: LoweringContext, ins: Instruction) -> ConvPlan:
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
    packed = ctx.packed_weights.get(key)
    if packed is None:
        packed = torch.ops.mkldnn._reorder_convolution_weight(
            w.contiguous(), padding, list(op.stride), list(op.dilation), op.group, lens
        )
        ctx.packed_weights[key] = packed
    return ConvPlan(packed, padding, list(op.stride), list(op.dilation), op.group, pre_pad)


def conv_producer(ctx: LoweringContext, x: int, plan: ConvPlan) -> Callable[[], torch.Tensor]:
    """The closure running `plan` on env[x] and returning the (new) output tensor."""
    env = ctx.env
    conv = torch.ops.mkldnn._convolution_pointwise
    binary = torch.ops.mkldnn._convolution_pointwise.binary
    w, b, p, s, d, g = plan.weight, plan.bias, plan.padding, plan.stride, plan.dilation, plan.groups
    unary, scalars, pre_pad = plan.unary, plan.scalars, plan.pre_pad
    cl = torch.channels_last

    def prepare_input() -> torch.Tensor:
        xt = env[x].contiguous(memory_format=cl)
        return F.pad(xt, pre_pad) if pre_pad is not None else xt

    if plan.other is not None:
        o = plan.other
        post = None if unary == "none" else unary

        def run_binary() -> torch.Tensor:
            other = env[o].contiguous(memory_format=cl)
            return binary(prepare_input(), other, w, b, p, s, d, g, "add", None, post, [], "")

        return run_binary
    if pre_pad is None:

        def run() -> torch.Tensor:
            return conv(env[x].contiguous(memory_format=cl), w, b, p, s, d, g, unary, scalars, "")

        return run

    def run_padded() -> torch.Tensor:
        return conv(prepare_input(), w, b, p, s, d, g, unary, scalars, "")

    return run_padded


def lower_mkldnn_convolution(ctx: LoweringContext, ins: Instruction) -> bool:
    if not mkldnn_usable(ctx, ins):
        return False
    user = ins.outputs[0] if len(ins.outputs) == 1 else None
    # the epilogue is matched when the user is reached (its other inputs are lowered by then)
    if user is not None and _may_fuse(ins, user) and defer(ctx, ins, user, _fuse):
        return True
    _lower_alone(ctx, ins)
    return True


def _lower_alone(ctx: LoweringContext, ins: Instruction) -> None:
    plan = conv_plan(ctx, ins)
    store_result(ctx, ins, conv_producer(ctx, ctx.arg(ins, 0), plan), CHANNELS_LAST)


def _may_fuse(conv: Instruction, user: Instruction) -> bool:
    return (
        user.op.name == "pointwise"
        and user.shape.type() == conv.shape.type()
        and user.shape.lens() == conv.shape.lens()
        and sum(1 for i in user.inputs if i is conv) == 1
    )


# --- epilogue matching ----------------------------------------------------------------------


@dataclass
class Epilogue:
    bias: np.ndarray  # per channel, summed constants
    other: Instruction | None
    unary: str
    scalars: list[float]


def match_epilogue(ctx: LoweringContext, conv: Instruction, user: Instruction) -> Epilogue | None:
    """`user`'s body as act(conv + constants [+ other]), or None."""
    if is_deferred(ctx, user) or user.shape.type() != conv.shape.type():
        return None
    body: Module = user.module_inputs[0]
    params = body.get_parameters()
    outer = {id(p): x for p, x in zip(params, user.inputs, strict=True)}
    node = body.get_returns()[0]
    unary, scalars = "none", []
    act = _activation(ctx, node, outer)
    if act is not None:
        unary, scalars, node = act
    leaves: list[Instruction] = []
    if not _add_leaves(node, leaves, root=True):
        return None
    channels = conv.shape.lens()[1]
    bias = np.zeros(channels, dtype=np.float32)
    other = None
    seen_conv = False
    for leaf in leaves:
        x = outer.get(id(leaf))
        if x is None:
            return None
        if x is conv:
            if seen_conv:
                return None
            seen_conv = True
            continue
        c = _channel_constant(ctx, x, channels)
        if c is not None:
            bias += c
        elif other is None and not x.shape.broadcasted():
            other = x
        else:
            return None
    if not seen_conv:
        return None
    return Epilogue(bias, other, unary, scalars)


def _add_leaves(node: Instruction, leaves: list[Instruction], root: bool = False) -> bool:
    if node.op.name == "add" and (root or len(node.outputs) == 1):
        return all(_add_leaves(i, leaves) for i in node.inputs)
    if node.is_param():
        leaves.append(node)
        return True
    return False


def _activation(
    ctx: LoweringContext, node: Instruction, outer: dict[int, Instruction]
) -> tuple[str, list[float], Instruction] | None:
    """(unary attr, scalars, input) of a relu / relu6 at the root, or None."""
    name = node.op.name
    if name == "relu":
        return "relu", [], node.inputs[0]
    if name == "clip":
        lo, hi = (_scalar(ctx, outer.get(id(i))) for i in node.inputs[1:])
        if lo is not None and hi is not None:
            return "hardtanh", [lo, hi], node.inputs[0]
    if name == "min" and len(node.inputs) == 2:
        inner, hi_ins = node.inputs
        if inner.op.name != "max":
            inner, hi_ins = hi_ins, inner
        if inner.op.name == "max" and len(inner.outputs) == 1:
            x, lo_ins = inner.inputs
            lo = _scalar(ctx, outer.get(id(lo_ins)))
            if lo is None:
                x, lo_ins = lo_ins, x
                lo = _scalar(ctx, outer.get(id(lo_ins)))
            hi = _scalar(ctx, outer.get(id(hi_ins)))
            if lo is not None and hi is not None and lo <= hi:
                return "hardtanh", [lo, hi], x
    return None


def _scalar(ctx: LoweringContext, x: Instruction | None) -> float | None:
    """The value of a constant that is one number broadcast everywhere."""
    if x is None or id(x) not in ctx.index:
        return None
    t = ctx.constant(ctx.index[id(x)])
    if t is None or t.numel() == 0 or not t.dtype.is_floating_point:
        return None
    v = t[(0,) * t.dim()]
    if any(s != 0 for s, n in zip(t.stride(), t.shape, strict=True) if n != 1):
        if t.numel() > 4096 or not bool((t == v).all()):
            return None
    return float(v)


def _channel_constant(ctx: LoweringContext, x: Instruction, channels: int) -> np.ndarray | None:
    """A constant that varies along the channel axis only, as a (C,) float32 vector."""
    if id(x) not in ctx.index:
        return None
    t = ctx.constant(ctx.index[id(x)])
    if t is None or t.dim() != 4 or t.dtype not in (torch.float32, torch.bfloat16):
        return None
    strides = t.stride()
    if any(strides[k] != 0 for k in (0, 2, 3) if t.shape[k] != 1):
        return None
    vec = t[0, :, 0, 0]
    if vec.shape[0] != channels:
        return None
    return vec.float().numpy()


def _fuse(ctx: LoweringContext, user: Instruction) -> bool:
    """Emit conv + epilogue as one oneDNN call; the separate steps are kept for profiling."""
    from pygraphx.targets.torch_lowering.lower_math import lower_pointwise

    conv = deferred_producer(ctx, user)
    epi = match_epilogue(ctx, conv, user)
    if epi is None:  # not a form oneDNN fuses: the convolution runs first, on its own
        _lower_alone(ctx, conv)
        return False
    saved, ctx.steps = ctx.steps, []
    _lower_alone(ctx, conv)
    if not lower_pointwise(ctx, user):
        lower_fallback(ctx, user)
    unfused, ctx.steps = ctx.steps, saved
    uidx = ctx.index[id(user)]
    if ctx.options.get("conv_output", "torch") != "arena" and ctx.static[uidx]:
        # the fused step stores a new tensor at the group's index: so must its unfused step
        unfused[-1].fn = storing(unfused[-1].fn, ctx.env, uidx, ctx.env[uidx])
    plan = conv_plan(ctx, conv)
    dtype = torch_dtype(conv.shape.dtype())  # oneDNN takes the bias in the input's type
    plan.bias = torch.from_numpy(epi.bias).to(dtype) if epi.bias.any() else None
    plan.unary, plan.scalars = epi.unary, epi.scalars
    if epi.other is not None:
        plan.other = ctx.index[id(epi.other)]
        if plan.unary not in ("none", "relu") or plan.pre_pad is not None:
            ctx.steps = saved + unfused
            return True  # oneDNN fuses only relu after a binary add: run them apart
    produce = conv_producer(ctx, ctx.arg(conv, 0), plan)
    unfused_idx = uidx
    env = ctx.env
    if ctx.options.get("conv_output", "torch") == "arena" and ctx.static[unfused_idx]:
        out = env[unfused_idx]

        def step() -> None:
            out.copy_(produce())

    else:
        ctx.static[unfused_idx] = False
        ctx.mark_fresh(unfused_idx)

        def step() -> None:
            env[unfused_idx] = produce()

    ctx.emit(step, [conv, user], unfused_idx, unfused)
    ctx.layout[unfused_idx] = CHANNELS_LAST
    return True
