"""swap_resize_convolution: run a 1x1 convolution before the upsampling resize that feeds it.

A nearest or linear `resize` of the spatial dimensions interpolates each channel on its own
with weights that sum to 1 (linear: two clamped taps per axis; nearest: one tap), and a 1x1,
stride-1, unpadded, ungrouped `convolution` mixes channels pixel by pixel. The two commute:

    convolution(resize(x), w)      == resize(convolution(x, w))
    convolution(resize(x), w) + b  == resize(convolution(x, w) + b)   (b constant per channel)

exactly in real arithmetic (rounding apart). When the resize enlarges, the rewritten form runs
the convolution (and the bias add) on the smaller tensor, and the resize on the convolution's
output channels instead of its input channels (UNet's decoder: bilinear x2 then a 1x1 conv that
halves the channels, so both steps shrink 4x and 2x).

Only where it is exact and a gain: mode nearest (any nearest_mode), or linear with
coordinate_transformation_mode half_pixel / pytorch_half_pixel / align_corners / asymmetric;
static parameters (one input), no antialias; batch and channel dimensions unchanged; every
spatial dimension kept or enlarged and at least one enlarged (never a shrink); a floating-point
type; the resize's only user the convolution. A bias add is carried across when it is the
convolution's only user and its other operand is a per-channel broadcast (`broadcast` at axis
1 of an [M] tensor, or a `multibroadcast` of an [M, 1, 1]-like tensor).

Switch: `PGX_DISABLE_PASSES=swap_resize_convolution` keeps the original graph.
"""

from __future__ import annotations

import dataclasses

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ir.shape import FLOAT_TYPES
from pygraphx.passes.dead_code_elimination import dead_code_elimination

#: linear coordinate modes whose per-axis weights are two clamped taps summing to 1
LINEAR_MODES = frozenset(["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])


def _commutes(resize: Instruction) -> bool:
    """Whether `resize` interpolates spatial dims only, enlarging, with weights summing to 1."""
    op = resize.op
    if len(resize.inputs) != 1 or op.antialias:
        return False
    if op.mode == "nearest":
        if op.coordinate_transformation_mode == "tf_crop_and_resize":
            return False
    elif op.mode != "linear" or op.coordinate_transformation_mode not in LINEAR_MODES:
        return False
    src = resize.inputs[0].shape
    if src.type() not in FLOAT_TYPES or src.ndim() < 3:
        return False
    lin, lout = src.lens(), list(op.sizes)
    if lin[:2] != lout[:2] or any(float(s) != 1.0 for s in op.scales[:2]):
        return False
    return all(o >= i for i, o in zip(lin[2:], lout[2:], strict=True)) and lout[2:] != lin[2:]


def _pointwise_conv(conv: Instruction) -> bool:
    """A 1x1 (every spatial kernel dim 1), stride-1, unpadded, group-1 convolution."""
    op = conv.op
    if op.name != "convolution" or len(conv.inputs) != 2 or op.group != 1 or op.padding_mode:
        return False
    w = conv.inputs[1].shape.lens()
    nd = len(w) - 2
    return (
        all(k == 1 for k in w[2:])
        and all(s == 1 for s in op.stride)
        and all(p == 0 for p in op.padding)
        and len(op.stride) == nd
    )


def _channel_bias(conv: Instruction) -> tuple[Instruction, Instruction] | None:
    """(add, broadcast) when the convolution's only user adds a per-channel constant."""
    if len(conv.outputs) != 1:
        return None
    add = conv.outputs[0]
    if add.op.name != "add" or len(add.inputs) != 2 or add.inputs[0] is add.inputs[1]:
        return None
    other = add.inputs[1] if add.inputs[0] is conv else add.inputs[0]
    if len(other.outputs) != 1 or len(other.inputs) != 1:
        return None
    lens = conv.shape.lens()
    src = other.inputs[0].shape.lens()
    if other.op.name == "broadcast":
        ok = other.op.axis == 1 and list(src) == [lens[1]]
    elif other.op.name == "multibroadcast":
        full = [1] * (len(lens) - len(src)) + list(src)
        ok = len(full) == len(lens) and all(n == 1 for d, n in enumerate(full) if d != 1)
    else:
        ok = False
    return (add, other) if ok else None


def _gains(resize: Instruction, c_in: int, c_out: int) -> bool:
    """Whether moving the resize after the convolution saves time: the convolution then works
    on fewer pixels, but the resize on `c_out` channels instead of `c_in`. A nearest resize
    costs about a linear one's 4x on the cpu target (review13b, one process, 1 thread: nearest
    64 -> 64 channels 1.25x slower swapped, 4 -> 128 5.8x; 64 -> 32 0.64x), so it moves only
    where the convolution narrows the channels; a linear one where they do not widen."""
    return c_out < c_in if resize.op.mode == "nearest" else c_out <= c_in


def _swap(module: Module, conv: Instruction) -> bool:
    resize = conv.inputs[0]
    if resize.op.name != "resize" or resize.outputs != [conv] or conv.inputs[1] is resize:
        return False
    if not (_commutes(resize) and _pointwise_conv(conv)):
        return False
    x = resize.inputs[0]
    small = conv.op.compute_shape([x.shape, conv.inputs[1].shape])
    if list(small.lens()[:2]) != list(conv.shape.lens()[:2]):
        return False
    if not _gains(resize, x.shape.lens()[1], conv.shape.lens()[1]):
        return False
    first = module.insert_instruction(conv, conv.op, [x, conv.inputs[1]])
    last, replaced = first, conv
    bias = _channel_bias(conv)
    if bias is not None:
        add, bcast = bias
        b = module.insert_instruction(
            add, dataclasses.replace(bcast.op, out_lens=tuple(small.lens())), bcast.inputs
        )
        inputs = [first, b] if add.inputs[0] is conv else [b, first]
        last = module.insert_instruction(add, add.op, inputs)
        replaced = add
    sizes = (*small.lens()[:2], *resize.op.sizes[2:])
    up = module.insert_instruction(
        replaced, dataclasses.replace(resize.op, sizes=tuple(sizes)), [last]
    )
    module.replace_instruction(replaced, up)
    return True


def swap_resize_convolution(module: Module) -> None:
    """Move 1x1 convolutions (and their bias adds) in front of the upsampling resizes they read."""
    changed = False
    for ins in list(module.instructions):
        if ins.op.name == "convolution" and ins.inputs and ins.inputs[0].op.name == "resize":
            changed |= _swap(module, ins)
    if changed:
        dead_code_elimination(module)
