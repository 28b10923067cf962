"""Handlers of ONNX detection ops: RoiAlign, NonMaxSuppression, NonZero and Unique.

RoiAlign maps to the IR `roialign` op; opset 10 has no coordinate_transformation_mode and
behaves as `output_half_pixel`, opset 16 adds the attribute with `half_pixel` as its default.

NonMaxSuppression, NonZero and Unique have data-dependent output lengths (see
`pygraphx/ops/detection.py`). With constant inputs they are computed here into literals. Else
the IR op gets the length the model declares for the output (exact, checked at run time), or,
without one, its largest possible length as an upper bound (`Op.data_dependent`).
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.handlers.layout import arg
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops.detection import (
    Nonmaxsuppression,
    Nonzero,
    Roialign,
    Unique,
    non_max_suppression,
    nonzero,
    unique,
)

Args = list[Instruction | None]


def _declared(ctx: NodeContext, k: int, dim: int) -> int:
    """Dimension `dim` of the lens the model declares for output `k`, or -1."""
    lens = ctx.declared_lens(k)
    return lens[dim] if lens is not None and len(lens) > dim else -1


# --- RoiAlign ---------------------------------------------------------------------------------
def _roi_align(ctx: NodeContext, args: Args, default_mode: str) -> Instruction:
    x, rois, idx = args[:3]
    mode = ctx.attr("mode", "avg").lower()
    ctm = ctx.attr("coordinate_transformation_mode", default_mode).lower()
    if mode not in ("avg", "max"):
        raise ctx.error(f"mode {mode!r} is not 'avg' or 'max'")
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise ctx.error(
            f"coordinate_transformation_mode {ctm!r} is not 'half_pixel' or 'output_half_pixel'"
        )
    if x.shape.ndim() != 4:
        raise ctx.error(f"X must be [N, C, H, W], got {x.shape.lens()}")
    if rois.shape.lens()[-1:] != [4] or idx.shape.lens() != rois.shape.lens()[:1]:
        raise ctx.error(
            f"rois {rois.shape.lens()} must be [R, 4] and batch_indices {idx.shape.lens()} [R]"
        )
    op = Roialign(
        coordinate_transformation_mode=ctm,
        mode=mode,
        output_height=ctx.attr("output_height", 1),
        output_width=ctx.attr("output_width", 1),
        sampling_ratio=ctx.attr("sampling_ratio", 0),
        spatial_scale=ctx.attr("spatial_scale", 1.0),
    )
    return ctx.add(op, x, ctx.convert(rois, x.shape.type()), idx)


@onnx_op("RoiAlign", since=10)
def parse_roi_align_10(ctx: NodeContext, args: Args) -> Instruction:
    return _roi_align(ctx, args, "output_half_pixel")


@onnx_op("RoiAlign", since=16)
def parse_roi_align(ctx: NodeContext, args: Args) -> Instruction:
    return _roi_align(ctx, args, "half_pixel")


# --- NonMaxSuppression ------------------------------------------------------------------------
def _scalar(value: np.ndarray | None) -> np.generic | None:
    if value is None or np.asarray(value).size == 0:
        return None
    return np.asarray(value).reshape(-1)[0]


@onnx_op("NonMaxSuppression", since=10)
def parse_non_max_suppression(ctx: NodeContext, args: Args) -> Instruction:
    boxes, scores = args[0], args[1]
    max_out, iou, score = (arg(args, k) for k in (2, 3, 4))
    bl, sl = boxes.shape.lens(), scores.shape.lens()
    if len(bl) != 3 or bl[2] != 4 or len(sl) != 3 or sl[0] != bl[0] or sl[2] != bl[1]:
        raise ctx.error(f"boxes {bl} and scores {sl} must be [B, n, 4] and [B, C, n]")
    center = bool(ctx.attr("center_point_box", 0))
    max_value = ctx.const(max_out)
    if max_out is None or (max_value is not None and _scalar(max_value) is None):
        # no max_output_boxes_per_class: nothing is selected
        return ctx.literal(np.zeros((0, 3), np.int64))
    present = [a for a in (boxes, scores, iou, score) if a is not None]
    if max_value is not None and all(ctx.const(a) is not None for a in present):
        iou_value = _scalar(ctx.const(iou))
        out = non_max_suppression(
            ctx.const(boxes),
            ctx.const(scores),
            max(int(_scalar(max_value)), 0),
            0.0 if iou_value is None else iou_value,
            _scalar(ctx.const(score)),
            center,
        )
        return ctx.literal(out)
    if iou is None:
        iou = ctx.literal(np.zeros((), np.float32))
    inputs = [boxes, scores, max_out, iou] + ([score] if score is not None else [])
    max_boxes = -1 if max_value is None else max(int(_scalar(max_value)), 0)
    count = _declared(ctx, 0, 0)
    op = Nonmaxsuppression(center_point_box=center, max_boxes=max_boxes, count=count)
    return ctx.add(op, *inputs)


# --- NonZero ----------------------------------------------------------------------------------
@onnx_op("NonZero", since=9)
def parse_non_zero(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    value = ctx.const(x)
    if value is not None:
        return ctx.literal(nonzero(np.asarray(value)))
    return ctx.add(Nonzero(count=_declared(ctx, 0, 1)), x)


# --- Unique -----------------------------------------------------------------------------------
@onnx_op("Unique", since=11)
def parse_unique(ctx: NodeContext, args: Args) -> list[Instruction | None]:
    x = args[0]
    axis = ctx.attr("axis", None)
    if axis is not None:
        rank = x.shape.ndim()
        if not -rank <= axis < rank:
            raise ctx.error(f"axis {axis} is out of range for rank {rank}")
        axis %= rank
    sort = bool(ctx.attr("sorted", 1))
    wanted = [bool(name) for name in ctx.node.output]
    value = ctx.const(x)
    if value is not None:
        results = unique(np.asarray(value), axis, sort)
        return [ctx.literal(r) if w else None for r, w in zip(results, wanted, strict=False)]
    count = _declared(ctx, 0, 0 if axis is None else axis)
    for k in (1, 3):
        if count < 0 and k < len(wanted) and wanted[k]:
            count = _declared(ctx, k, 0)
    outs: list[Instruction | None] = []
    for k, w in enumerate(wanted):
        op = Unique(axis=axis, sorted=sort, output=k, count=count)
        outs.append(ctx.add(op, x) if w else None)
    return outs
