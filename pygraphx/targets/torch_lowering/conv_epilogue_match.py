"""A convolution's element-wise epilogue read out of its `pointwise` group.

`match_epilogue` reads a group's body as act(conv + c1 + c2 + ... [+ other]) (or, for `dnnl`,
act(conv + c1 + ...) + other): the per-channel or scalar constants summed into one float32
bias, the one full-tensor operand `other`, and the activation as a oneDNN unary post-op
(relu, clip(0, 6) as hardtanh, silu as swish). `conv_fusion.fuse_group` folds such a group
into its convolution; `conv_residual`, `lower_quant`, `deconv_bf16` and the gpu target's
`conv_epilogue` read epilogues the same way. Split out of `conv_fusion.py` (issue 10).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops.literal_views import wide_vector
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.registry import is_deferred


@dataclass
class Epilogue:
    bias: np.ndarray  # per channel, summed constants
    other: Instruction | None
    unary: str
    scalars: list[float]
    add_after: bool = False  # act(conv + constants) + other: the add comes after the activation


def match_epilogue(
    ctx: LoweringContext, conv: Instruction, user: Instruction, add_after: bool = False
) -> Epilogue | None:
    """`user`'s body as act(conv + constants [+ other]), or None; with `add_after`, also
    act(conv + constants) + other (YOLO's C2f shortcut: Conv-BN-SiLU, then the block's input
    added), which only oneDNN's own post-op chain (`dnnl`) runs fused."""
    if is_deferred(ctx, user) or user.shape.type() != conv.shape.type():
        return None
    body: Module = user.module_inputs[0]
    params = body.get_parameters()
    outer = {id(p): x for p, x in zip(params, user.inputs, strict=True)}
    root = body.get_returns()[0]
    epi = _match_chain(ctx, conv, root, outer)
    if epi is not None or not add_after or root.op.name != "add":
        return epi
    for inner, last in (root.inputs, root.inputs[::-1]):
        x = outer.get(id(last))
        if len(inner.outputs) != 1 or x is None or x is conv or x.shape.broadcasted():
            continue
        epi = _match_chain(ctx, conv, inner, outer)
        if epi is not None and epi.other is None and epi.unary != "none":
            if _channel_constant(ctx, x, conv.shape.lens()[1]) is None:
                return Epilogue(epi.bias, x, epi.unary, epi.scalars, add_after=True)
    return None


def _match_chain(
    ctx: LoweringContext, conv: Instruction, node: Instruction, outer: dict[int, Instruction]
) -> Epilogue | None:
    """`node` as act(conv + constants [+ other]) over the group's inputs `outer`, or None."""
    unary, scalars = "none", []
    act = _activation(ctx, node, outer)
    if act is not None:
        unary, scalars, node = act
    leaves: list[Instruction] = []
    if not add_leaves(node, leaves, root=True):
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


def add_leaves(node: Instruction, leaves: list[Instruction], root: bool = False) -> bool:
    """Whether the group body value `node` is a tree of `add`s (each inner one read only by
    the next) over the group's parameters, which it appends to `leaves` in order; the cpu and
    gpu convolution epilogues both read a bias and a residual out of such a sum."""
    if node.op.name == "add" and (root or len(node.outputs) == 1):
        return all(add_leaves(i, leaves) for i in node.inputs)
    if node.is_param():
        leaves.append(node)
        return True
    return False


def _activation(
    ctx: LoweringContext, node: Instruction, outer: dict[int, Instruction]
) -> tuple[str, list[float], Instruction] | None:
    """(unary attr, scalars, input) of a relu / relu6 / silu at the root, or None."""
    name = node.op.name
    if name == "relu":
        return "relu", [], node.inputs[0]
    if name == "silu":  # x * sigmoid(x): oneDNN's swish post-op (YOLO's Conv-BN-SiLU)
        return "swish", [], node.inputs[0]
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
    wide = wide_vector(x, channels) if t.dtype == torch.bfloat16 else None
    if wide is not None:  # a bf16 program's bias, unrounded (`quantize.wide_constants`,
        return wide.copy()  # `ops.literal_views`)
    return vec.float().numpy().copy()


def wide_bias(user: Instruction, conv: Instruction) -> bool:
    """A bf16 convolution's group adds a constant that kept its float32 value
    (`quantize.wide_constants`, `ops.literal_views`): the fused bias is then float32, which
    oneDNN's bf16 kernels take, added to the float32 accumulator before the one rounding (as
    OpenVINO's bf16 does)."""
    channels = conv.shape.lens()[1]
    return conv.shape.type() == "bf16_type" and any(
        wide_vector(x, channels) is not None for x in user.inputs
    )
