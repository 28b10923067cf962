"""Handlers of ONNX indexing ops: Gather, GatherElements, GatherND, Scatter, ScatterElements,
ScatterND, OneHot, Compress, ReverseSequence, Resize and Upsample.

OneHot and ReverseSequence are written with pointwise ops and gathers; Compress needs its
condition at compile time (its output length depends on it). Resize reads its scales or sizes
at compile time and becomes one `resize` op with every parameter resolved per dimension.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.handlers._runtime_shapes import guard, runtime_lens
from pygraphx.onnx.handlers.layout import arg, const_ints, norm_axes, norm_axis
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.indexing import (
    INDEX_TYPES,
    Compress,
    Gather,
    GatherElements,
    Gathernd,
    Resize,
    ScatterElements,
    Scatternd,
    resolve_resize,
    resolve_roi,
)
from pygraphx.ops.layout import Reshape, Slice, Unsqueeze
from pygraphx.ops.pointwise import Where

Args = list[Instruction | None]


def _indices(ctx: NodeContext, idx: Instruction | None, what: str = "indices") -> Instruction:
    if idx is None:  # an empty input name: the required input was left out (fuzz finding onnx-8)
        raise ctx.error(f"the {what} input is required but was left out (empty name)")
    if idx.shape.type() not in INDEX_TYPES:
        raise ctx.error(f"{what} must be int32 or int64, got {idx.shape.type()}")
    return idx


# --- gathers ------------------------------------------------------------------------------


@onnx_op("Gather")
def parse_gather(ctx: NodeContext, args: Args) -> Instruction:
    data, idx = args[0], _indices(ctx, args[1])
    axis = norm_axis(ctx, ctx.attr("axis", 0), data.shape.ndim())
    return ctx.add(Gather(axis), data, idx)


@onnx_op("GatherElements", since=11)
def parse_gather_elements(ctx: NodeContext, args: Args) -> Instruction:
    data, idx = args[0], _indices(ctx, args[1])
    axis = norm_axis(ctx, ctx.attr("axis", 0), data.shape.ndim())
    return ctx.add(GatherElements(axis), data, idx)


@onnx_op("GatherND", since=11)
def parse_gathernd(ctx: NodeContext, args: Args) -> Instruction:
    data, idx = args[0], _indices(ctx, args[1])
    return ctx.add(Gathernd(ctx.attr("batch_dims", 0)), data, idx)


# --- scatters -----------------------------------------------------------------------------


def _reduction(ctx: NodeContext) -> str:
    reduction = ctx.attr("reduction", "none")
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise ctx.error(f"unknown reduction {reduction!r}")
    return reduction


@onnx_op("Scatter", since=9)
def parse_scatter(ctx: NodeContext, args: Args) -> Instruction:
    data, idx, upd = args[0], _indices(ctx, args[1]), args[2]
    axis = norm_axis(ctx, ctx.attr("axis", 0), data.shape.ndim())
    return ctx.add(ScatterElements(axis, "none"), data, idx, upd)


@onnx_op("ScatterElements", since=11)
def parse_scatter_elements(ctx: NodeContext, args: Args) -> Instruction:
    data, idx, upd = args[0], _indices(ctx, args[1]), args[2]
    axis = norm_axis(ctx, ctx.attr("axis", 0), data.shape.ndim())
    return ctx.add(ScatterElements(axis, _reduction(ctx)), data, idx, upd)


@onnx_op("ScatterND", since=11)
def parse_scatternd(ctx: NodeContext, args: Args) -> Instruction:
    data, idx, upd = args[0], _indices(ctx, args[1]), args[2]
    return ctx.add(Scatternd(_reduction(ctx)), data, idx, upd)


# --- OneHot, Compress, ReverseSequence ------------------------------------------------------


@onnx_op("OneHot", since=9)
def parse_onehot(ctx: NodeContext, args: Args) -> Instruction:
    indices, depth_ins, values = args[0], args[1], args[2]
    if values.shape.elements() != 2 or values.shape.ndim() != 1:
        raise ctx.error(f"values must be [off_value, on_value], got lens {values.shape.lens()}")
    rank = indices.shape.ndim() + 1
    axis = norm_axis(ctx, ctx.attr("axis", -1), rank)
    depth_v = ctx.const(depth_ins)
    if depth_v is None:
        depth = runtime_lens(ctx, depth_ins, "depth")[axis]
        indices = guard(ctx, indices, depth_ins, "equal", [depth])
    else:
        depth_v = np.asarray(depth_v).reshape(-1)
        if depth_v.size != 1:
            raise ctx.error(f"depth must hold one value, got {depth_v.size}")
        depth = int(depth_v[0])
    if depth <= 0:
        raise ctx.error(f"depth must be positive, got {depth}")
    out_lens = indices.shape.lens()
    out_lens.insert(axis, depth)
    # integer indices, negatives counted from depth
    idx = ctx.convert(indices, "int64_type")
    wrapped = ctx.add(make_op("add"), idx, ctx.scalar(depth, idx))
    neg = ctx.add(make_op("less"), idx, ctx.scalar(0, idx))
    idx = ctx.add(Where(), neg, wrapped, idx)
    idx = ctx.broadcast_to(ctx.add(Unsqueeze((axis,)), idx), out_lens)
    classes = np.arange(depth, dtype=np.int64).reshape([depth] + [1] * (rank - 1 - axis))
    classes = ctx.broadcast_to(ctx.literal(classes), out_lens)
    hot = ctx.add(make_op("equal"), idx, classes)
    off = ctx.broadcast_to(ctx.add(Slice((0,), (0,), (1,)), values), out_lens)
    on = ctx.broadcast_to(ctx.add(Slice((0,), (1,), (2,)), values), out_lens)
    return ctx.add(Where(), hot, on, off)


@onnx_op("Compress", since=9)
def parse_compress(ctx: NodeContext, args: Args) -> Instruction:
    x, cond_ins = args[0], args[1]
    axis = ctx.attr("axis", None)
    if axis is None:
        x = ctx.add(Reshape((x.shape.elements(),)), x) if x.shape.ndim() != 1 else x
        axis = 0
    axis = norm_axis(ctx, axis, x.shape.ndim())
    n = x.shape.lens()[axis]
    cond = ctx.const(cond_ins)
    if cond is None:
        length = runtime_lens(ctx, cond_ins, "condition")[axis]
        if cond_ins.shape.ndim() != 1 or cond_ins.shape.elements() > n:
            raise ctx.error(f"condition lens {cond_ins.shape.lens()} do not fit an axis of {n}")
        return ctx.add(Compress(axis, length), x, ctx.convert(cond_ins, "bool_type"))
    cond = np.asarray(cond).reshape(-1).astype(bool)
    if cond.size > n:
        raise ctx.error(f"condition has {cond.size} values for an axis of length {n}")
    keep = np.nonzero(cond)[0].astype(np.int64)
    return ctx.add(Gather(axis), x, ctx.literal(keep))


@onnx_op("ReverseSequence", since=10)
def parse_reverse_sequence(ctx: NodeContext, args: Args) -> Instruction:
    x, seq = args[0], args[1]
    lens = x.shape.lens()
    rank = len(lens)
    if rank < 2:
        raise ctx.error(f"input must have rank >= 2, got lens {lens}")
    batch_axis = norm_axis(ctx, ctx.attr("batch_axis", 1), rank, "batch_axis")
    time_axis = norm_axis(ctx, ctx.attr("time_axis", 0), rank, "time_axis")
    if {batch_axis, time_axis} != {0, 1}:
        raise ctx.error(f"batch_axis and time_axis must be 0 and 1, got {batch_axis}, {time_axis}")
    if seq.shape.lens() != [lens[batch_axis]]:
        raise ctx.error(
            f"sequence_lens lens {seq.shape.lens()} must be [{lens[batch_axis]}] (the batch)"
        )
    t_len = lens[time_axis]
    # index along time: lens[b] - 1 - t for t < lens[b], else t
    grid = [1, 1]
    grid[time_axis] = t_len
    t = ctx.literal(np.arange(t_len, dtype=np.int64).reshape(grid))
    grid = [1, 1]
    grid[batch_axis] = lens[batch_axis]
    n = ctx.add(Reshape(tuple(grid)), ctx.convert(seq, "int64_type"))
    t, n = ctx.broadcast(t, n)
    rev = ctx.add(make_op("sub"), ctx.add(make_op("sub"), n, ctx.scalar(1, n)), t)
    idx = ctx.add(Where(), ctx.add(make_op("less"), t, n), rev, t)
    folded = ctx.const(idx)
    if folded is not None:
        idx = ctx.literal(np.asarray(folded, order="C"))
    if rank > 2:
        idx = ctx.add(Unsqueeze(tuple(range(2, rank))), idx)
    idx = ctx.broadcast_to(idx, lens)
    return ctx.add(GatherElements(time_axis), x, idx)


# --- Resize, Upsample ---------------------------------------------------------------------

RESIZE_MODE_ALIASES = {"bilinear": "linear", "trilinear": "linear", "bicubic": "cubic"}


def _is_empty(ctx: NodeContext, ins: Instruction | None) -> bool:
    """An omitted optional input, or a tensor with no elements (ONNX's "not given")."""
    return ins is None or ins.shape.elements() == 0


def _floats(ctx: NodeContext, ins: Instruction | None, what: str) -> list[float] | None:
    if _is_empty(ctx, ins):
        return None
    return [float(f) for f in np.asarray(ctx.require_const(ins, what)).reshape(-1)]


def resize(
    ctx: NodeContext,
    x: Instruction,
    *,
    roi: Instruction | None,
    scales: Instruction | None,
    sizes: Instruction | None,
    mode: str,
    coordinate_mode: str,
    nearest_mode: str,
    axes: Sequence[int] | None = None,
    policy: str = "stretch",
    cubic_coeff_a: float = -0.75,
    exclude_outside: bool = False,
    extrapolation_value: float = 0.0,
    antialias: bool = False,
) -> Instruction:
    """Resolve ONNX Resize's parameters to one value per dimension and add a `resize`.

    Compile-time scales/sizes/roi give a static op; run-time ones are passed to the op as
    inputs, and the output lens are the ones the model declares.
    """
    lens = x.shape.lens()
    rank = len(lens)
    axes = list(range(rank)) if axes is None else norm_axes(ctx, axes, rank)
    mode = RESIZE_MODE_ALIASES.get(mode, mode)
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.error(f"unknown mode {mode!r} (nearest, linear, cubic)")
    if _is_empty(ctx, scales) and _is_empty(ctx, sizes):
        raise ctx.error("Resize needs either scales or sizes")
    crop = coordinate_mode == "tf_crop_and_resize"
    if crop and _is_empty(ctx, roi):
        raise ctx.error("tf_crop_and_resize needs the roi input")
    attrs = dict(
        mode=mode,
        coordinate_transformation_mode=coordinate_mode,
        nearest_mode=nearest_mode,
        cubic_coeff_a=float(cubic_coeff_a),
        exclude_outside=bool(exclude_outside),
        extrapolation_value=float(extrapolation_value),
        antialias=bool(antialias),
    )
    params = [p for p in (scales, sizes, roi if crop else None) if not _is_empty(ctx, p)]
    dynamic = [p for p in params if ctx.const(p) is None]
    if dynamic:
        out_lens = runtime_lens(ctx, dynamic[0], "scales/sizes/roi")
        if len(out_lens) != rank:
            raise ctx.error(f"declared output lens {out_lens} do not match input {lens}")

        def param(ins: Instruction | None, dtype: type) -> Instruction:
            return ctx.literal(np.zeros(0, dtype)) if _is_empty(ctx, ins) else ins

        op = Resize(
            sizes=tuple(out_lens),
            scales=tuple(o / n if n else 1.0 for o, n in zip(out_lens, lens, strict=True)),
            axes=tuple(axes),
            keep_aspect_ratio_policy=policy,
            **attrs,
        )
        roi_in = param(roi if crop else None, np.float32)
        return ctx.add(op, x, roi_in, param(scales, np.float32), param(sizes, np.int64))
    scale_values = _floats(ctx, scales, "scales")
    size_values = None if scale_values else const_ints(ctx, sizes, "sizes")
    try:
        out_lens, full_scales = resolve_resize(lens, axes, scale_values, size_values, policy)
        box = resolve_roi(rank, axes, _floats(ctx, roi, "roi") or []) if crop else ()
    except ValueError as exc:
        raise ctx.error(str(exc)) from None
    if not crop and out_lens == lens and all(f == 1.0 for f in full_scales):
        return x
    op = Resize(sizes=tuple(out_lens), scales=tuple(full_scales), roi=box, **attrs)
    return ctx.add(op, x)


@onnx_op("Resize", since=10)
def parse_resize_v10(ctx: NodeContext, args: Args) -> Instruction:
    return resize(
        ctx, args[0], roi=None, scales=args[1], sizes=None, mode=ctx.attr("mode", "nearest"),
        coordinate_mode="asymmetric", nearest_mode="simple",
    )  # fmt: skip


@onnx_op("Resize", since=11)
def parse_resize(ctx: NodeContext, args: Args) -> Instruction:
    return resize(
        ctx,
        args[0],
        roi=arg(args, 1),
        scales=arg(args, 2),
        sizes=arg(args, 3),
        mode=ctx.attr("mode", "nearest"),
        coordinate_mode=ctx.attr("coordinate_transformation_mode", "half_pixel"),
        nearest_mode=ctx.attr("nearest_mode", "round_prefer_floor"),
        axes=ctx.attr("axes", None) if ctx.opset >= 18 else None,
        policy=ctx.attr("keep_aspect_ratio_policy", "stretch"),
        cubic_coeff_a=ctx.attr("cubic_coeff_a", -0.75),
        exclude_outside=bool(ctx.attr("exclude_outside", 0)),
        extrapolation_value=ctx.attr("extrapolation_value", 0.0),
        antialias=bool(ctx.attr("antialias", 0)),
    )


def _upsample(ctx: NodeContext, x: Instruction, scales: Instruction) -> Instruction:
    if scales.shape.elements() != x.shape.ndim():
        raise ctx.error(f"scales need one value per axis of {x.shape.lens()}")
    return resize(
        ctx, x, roi=None, scales=scales, sizes=None, mode=ctx.attr("mode", "nearest"),
        coordinate_mode="asymmetric", nearest_mode="simple",
    )  # fmt: skip


@onnx_op("Upsample", since=7)
def parse_upsample_v7(ctx: NodeContext, args: Args) -> Instruction:
    scales = np.asarray(ctx.attr("scales"), dtype=np.float32)
    return _upsample(ctx, args[0], ctx.literal(scales))


@onnx_op("Upsample", since=9)
def parse_upsample(ctx: NodeContext, args: Args) -> Instruction:
    return _upsample(ctx, args[0], args[1])
