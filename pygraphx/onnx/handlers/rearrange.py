"""Handlers of ONNX ops that rearrange elements: DepthToSpace, SpaceToDepth, Trilu and
CenterCropPad, each written as layout IR (reshape/transpose), a mask, or pad + slice.
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.handlers._runtime_shapes import guard, runtime_lens
from pygraphx.onnx.handlers.layout import Args, arg, norm_axes, pad
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.layout import Reshape, Slice, Transpose
from pygraphx.ops.pointwise import Where

# --- DepthToSpace, SpaceToDepth -------------------------------------------------------------


def _block_args(ctx: NodeContext, x: Instruction) -> tuple[list[int], int, bool]:
    """The input's lens (N, C, H, W), the blocksize and whether the mode is DCR (else CRD)."""
    lens = x.shape.lens()
    if len(lens) != 4:
        raise ctx.error(f"input must be 4-D (N, C, H, W), got lens {lens}")
    b = ctx.attr("blocksize")
    if b <= 0:
        raise ctx.error(f"blocksize must be positive, got {b}")
    mode = ctx.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ctx.error(f"unknown mode {mode!r} (DCR or CRD)")
    return lens, b, mode == "DCR"


@onnx_op("DepthToSpace")
def parse_depth_to_space(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    (n, c, h, w), b, dcr = _block_args(ctx, x)
    if c % (b * b):
        raise ctx.error(f"channels {c} are not divisible by blocksize^2 = {b * b}")
    c2 = c // (b * b)
    if dcr:
        dims, perm = (n, b, b, c2, h, w), (0, 3, 4, 1, 5, 2)
    else:
        dims, perm = (n, c2, b, b, h, w), (0, 1, 4, 2, 5, 3)
    y = ctx.add(Transpose(perm), ctx.add(Reshape(dims), x))
    return ctx.add(Reshape((n, c2, h * b, w * b)), y)


@onnx_op("SpaceToDepth")
def parse_space_to_depth(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    (n, c, h, w), b, dcr = _block_args(ctx, x)
    if h % b or w % b:
        raise ctx.error(f"spatial lens {h}x{w} are not divisible by blocksize {b}")
    perm = (0, 3, 5, 1, 2, 4) if dcr else (0, 1, 3, 5, 2, 4)
    y = ctx.add(Transpose(perm), ctx.add(Reshape((n, c, h // b, b, w // b, b)), x))
    return ctx.add(Reshape((n, c * b * b, h // b, w // b)), y)


# --- Trilu --------------------------------------------------------------------------------


@onnx_op("Trilu", since=14)
def parse_trilu(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    lens = x.shape.lens()
    if len(lens) < 2:
        raise ctx.error(f"input must have rank >= 2, got lens {lens}")
    rows, cols = lens[-2], lens[-1]
    diff = np.arange(cols, dtype=np.int64)[None, :] - np.arange(rows, dtype=np.int64)[:, None]
    upper = bool(ctx.attr("upper", 1))
    k_ins = arg(args, 1)
    k_value = ctx.const(k_ins) if k_ins is not None else np.zeros((), np.int64)
    if k_value is not None:
        k = int(np.asarray(k_value).reshape(-1)[0])
        m = ctx.literal(diff >= k if upper else diff <= k)
    else:
        # k known only at run time: compare the diagonal offsets with it
        k_ins = ctx.convert(ctx.add(Reshape(()), k_ins), "int64_type")
        d, kb = ctx.broadcast(ctx.literal(diff), k_ins)
        m = ctx.add(make_op("greater_or_equal" if upper else "less_or_equal"), d, kb)
    return ctx.add(Where(), ctx.broadcast_to(m, lens), x, ctx.scalar(0, x))


# --- CenterCropPad ------------------------------------------------------------------------


@onnx_op("CenterCropPad", since=18)
def parse_center_crop_pad(ctx: NodeContext, args: Args) -> Instruction:
    """Crop (centred, extra element at the end) or zero-pad each of `axes` to `shape`."""
    x, shape = args[0], args[1]
    lens = x.shape.lens()
    rank = len(lens)
    axes = norm_axes(ctx, ctx.attr("axes", tuple(range(rank))), rank)
    value = ctx.const(shape)
    if value is None:
        declared = runtime_lens(ctx, shape, "shape")
        target = [declared[a] for a in axes]
        x = guard(ctx, x, shape, "equal", target)
    else:
        target = [int(v) for v in np.asarray(value).reshape(-1)]
    if len(target) != len(axes):
        raise ctx.error(f"shape {target} needs one length per axis of {axes}")
    crop_axes, starts, ends = [], [], []
    pads = [0] * (2 * rank)
    for a, t in zip(axes, target, strict=True):
        n = lens[a]
        if t < n:
            crop_axes.append(a)
            starts.append((n - t) // 2)
            ends.append((n - t) // 2 + t)
        elif t > n:
            pads[a] = (t - n) // 2
            pads[a + rank] = t - n - pads[a]
    if crop_axes:
        x = ctx.add(Slice(tuple(crop_axes), tuple(starts), tuple(ends)), x)
    if any(pads):
        x = pad(ctx, x, pads, "constant", 0)
    return x
