"""Which convolution groups may write their result over the residual they add (the cpu
target's `shared_slot` for the memory plan, `memory_coloring.plan_memory`).

A ResNet block ends in relu(conv(x) + bias + r): the `dnnl` kernel runs it as one primitive
with the add as a post-op. Given its own arena slot, the primitive reads r and writes a new
buffer; a slot the network has not touched for a while is not in the caches, and the core
reads it in before writing (write-allocate): one more pass over the output's bytes. Given r's
slot (r dies at the group), the same primitive runs with oneDNN's `sum` post-op first
(`ConvPlan.accumulate`: dst = conv + dst, then the activation) and never reads another buffer.
ResNet-50's expansion layers, caches flushed (64 MiB), 1 thread of the 2-core EPYC:
56x56 1.29 -> 1.08 ms at batch 1, 11.3 -> 9.8 at batch 8 (`benchmarks/rn11_layers.py`).

`residual_slot(user)` names the residual `r` of a group the lowering will fuse whole with its
convolution (`conv_fusion.fuse_group`): act(conv + per-channel constants + r), act a relu or
nothing, r of the group's lens and type, itself such a fused group's result or a convolution's
(so it lives in a channels-last arena slot like the group's); where the group sums two
convolutions (ResNet's downsample blocks) r is the earlier one, the later being the one fused.
Not where the convolution is one the Winograd kernels may take (3x3, stride 1): they do not
accumulate. The memory plan gives the group r's buffer where r dies there; the lowering claims
that slot (`LoweringContext.claim_shared`: a shared slot nobody claims is no slot, its value a
new tensor) and checks that the two are one channels-last tensor, else the group's result goes
to a new tensor.
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.conv_dw_fusion import block_ending, fused_user
from pygraphx.targets.torch_lowering.conv_epilogue_match import add_leaves

#: the activations after the sum that oneDNN's chain (sum, then eltwise) runs
ACTIVATIONS = ("relu",)


def residual_slot(user: Instruction) -> Instruction | None:
    """The residual whose slot the fused group `user` may write its result over, or None."""
    parts = _group_parts(user)
    if parts is None:
        return None
    conv, other = parts
    if other is None or other.op.name not in ("pointwise", "convolution"):
        return None
    if block_ending(user) is not None:  # mbv14: the native block reads its input to the end
        return None
    if _winograd_shape(conv):
        return None
    if other.op.name == "pointwise" and _group_parts(other) is None:
        return None
    return other


def _group_parts(user: Instruction) -> tuple[Instruction, Instruction | None] | None:
    """(convolution, residual or None) of a group act(conv + constants [+ residual]) that the
    convolution is fused into, else None."""
    if user.op.name != "pointwise" or not user.module_inputs:
        return None
    body = user.module_inputs[0]
    outer = {id(p): x for p, x in zip(body.get_parameters(), user.inputs, strict=True)}
    node = body.get_returns()[0]
    if node.op.name in ACTIVATIONS:
        node = node.inputs[0]
    leaves: list[Instruction] = []
    if not add_leaves(node, leaves, root=True):
        return None
    convs, others = [], []
    for leaf in leaves:
        x = outer.get(id(leaf))
        if x is None:
            return None
        if x.op.name == "convolution" and fused_user(x) is user:
            convs.append(x)
        elif not _channel_literal(x, user):
            others.append(x)
    if not convs:
        return None
    # the lowering fuses the convolution right before the group (`registry.defer`): the last
    conv = convs[0] if len(convs) == 1 else max(convs, key=lambda c: _order(user)[id(c)])
    others += [c for c in convs if c is not conv]
    if len(others) > 1 or (others and not _same_value_shape(others[0], user)):
        return None
    other = others[0] if others else None
    if other is not None and any(i is other for i in conv.inputs):
        return None
    return conv, other


def _winograd_shape(conv: Instruction) -> bool:
    """A 3x3 stride-1 convolution, which the Winograd kernels may run (`winograd.supports`):
    they add a residual of their own and do not accumulate, so such a group keeps its slot."""
    op, lens = conv.op, conv.inputs[1].shape.lens()
    return (
        list(lens[2:]) == [3, 3]
        and op.group == 1
        and all(s == 1 for s in op.stride)
        and all(d == 1 for d in op.dilation)
    )


def _order(user: Instruction) -> dict[int, int]:
    """id(instruction) -> its index in `user`'s module."""
    return {id(ins): k for k, ins in enumerate(user.module.instructions)}


def _same_value_shape(x: Instruction, user: Instruction) -> bool:
    """`x` has `user`'s lens and type and is a value of its own (not a view, a parameter or
    a literal)."""
    if x.is_param() or x.is_literal() or x.op.output_alias(len(x.inputs)) >= 0:
        return False
    return x.shape.lens() == user.shape.lens() and x.shape.type() == user.shape.type()


def _channel_literal(x: Instruction, user: Instruction) -> bool:
    """`x` is a literal (or a broadcast of one) of the group's lens that varies along the
    channel axis only (a bias)."""
    lens = user.shape.lens()
    if x.shape.lens() != lens or len(lens) != 4:
        return False
    root = x.inputs[0] if x.op.name in ("broadcast", "multibroadcast") and x.inputs else x
    if not root.is_literal():
        return False
    strides = x.shape.strides()
    return all(strides[k] == 0 for k in (0, 2, 3) if lens[k] != 1)


__all__ = ["residual_slot"]
