"""Handlers of the remaining default-domain ONNX ops: GridSample, AffineGrid, Col2Im, CumProd,
TensorScatter and BitCast.

GridSample, Col2Im, CumProd, TensorScatter and BitCast map to IR ops of their own (see
`pygraphx/ops/extra.py`); GridSample's opset-16 mode names (bilinear, bicubic) become opset 20's
(linear, cubic). AffineGrid is decomposed: the base grid of normalised positions (x, y[, z], 1)
is a literal, multiplied with theta^T by a batched `dot` and reshaped to [N, H, W, 2] or
[N, D, H, W, 3].

Inputs that decide a shape but arrive at run time are taken from the lens the model declares
for the output and checked at run time: AffineGrid's size and Col2Im's image_shape through
`shape_guard`; Col2Im's block_shape and CumProd's axis are read by the IR op itself.
Bernoulli and the Random* ops are nondeterministic and not supported.
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext, onnx_type_to_shape_type
from pygraphx.onnx.handlers._runtime_shapes import guard, runtime_lens
from pygraphx.onnx.handlers.layout import arg
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops.broadcast import Multibroadcast
from pygraphx.ops.extra import Bitcast, Col2im, GridSample, PrefixScanProd, TensorScatter
from pygraphx.ops.gemm import Dot
from pygraphx.ops.indexing import Gather
from pygraphx.ops.layout import Reshape, Transpose

Args = list[Instruction | None]


def _const_ints(ctx: NodeContext, ins: Instruction | None) -> list[int] | None:
    value = ctx.const(ins)
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


# --- GridSample -------------------------------------------------------------------------------
_OLD_MODES = {"bilinear": "linear", "bicubic": "cubic", "nearest": "nearest"}


def _grid_sample(ctx: NodeContext, args: Args, modes: dict[str, str]) -> Instruction:
    x, grid = args[0], args[1]
    mode = ctx.attr("mode", "bilinear" if "bilinear" in modes else "linear")
    if mode not in modes:
        raise ctx.error(f"mode {mode!r} is not one of {', '.join(modes)}")
    padding = ctx.attr("padding_mode", "zeros")
    if padding not in ("zeros", "border", "reflection"):
        raise ctx.error(f"padding_mode {padding!r} is not zeros, border or reflection")
    xl, gl = x.shape.lens(), grid.shape.lens()
    nd = len(xl) - 2
    if nd < 1 or len(gl) != nd + 2 or gl[0] != xl[0] or gl[-1] != nd:
        raise ctx.error(f"X {xl} and grid {gl} must be [N, C, D1..Dk] and [N, O1..Ok, k]")
    if ctx.opset < 20 and nd != 2:
        raise ctx.error(f"GridSample-16 takes 4-D inputs, got X {xl}")
    op = GridSample(
        mode=modes[mode], padding_mode=padding, align_corners=bool(ctx.attr("align_corners", 0))
    )
    return ctx.add(op, x, grid)


@onnx_op("GridSample", since=16)
def parse_grid_sample_16(ctx: NodeContext, args: Args) -> Instruction:
    return _grid_sample(ctx, args, _OLD_MODES)


@onnx_op("GridSample", since=20)
def parse_grid_sample(ctx: NodeContext, args: Args) -> Instruction:
    return _grid_sample(ctx, args, {m: m for m in ("linear", "nearest", "cubic")})


# --- AffineGrid -------------------------------------------------------------------------------
def _positions(n: int, align_corners: bool) -> np.ndarray:
    """n normalised positions in [-1, 1]: pixel centres (align_corners) or cell centres."""
    k = np.arange(n, dtype=np.float64)
    if align_corners:
        return -1.0 + 2.0 * k / (n - 1) if n > 1 else np.full(n, -1.0)
    return -1.0 + (2.0 * k + 1.0) / n


def affine_base_grid(spatial: list[int], align_corners: bool) -> np.ndarray:
    """[prod(spatial), k + 1] homogeneous positions (x, y[, z], 1), x fastest."""
    axes = [_positions(n, align_corners) for n in spatial]  # D?, H, W order
    mesh = np.meshgrid(*axes, indexing="ij")
    cols = [m.reshape(-1) for m in reversed(mesh)]  # x, y[, z]
    return np.stack([*cols, np.ones_like(cols[0])], axis=1)


@onnx_op("AffineGrid", since=20)
def parse_affine_grid(ctx: NodeContext, args: Args) -> Instruction:
    theta, size_ins = args[0], args[1]
    tl = theta.shape.lens()
    if len(tl) != 3 or (tl[1:] != [2, 3] and tl[1:] != [3, 4]):
        raise ctx.error(f"theta {tl} must be [N, 2, 3] (2-D) or [N, 3, 4] (3-D)")
    nd = tl[1]
    size = _const_ints(ctx, size_ins)
    if size is None:
        lens = runtime_lens(ctx, size_ins, "size")
        if len(lens) != nd + 2:
            raise ctx.error(f"the declared output {lens} is not [N, spatial..., {nd}]")
        spatial = lens[1:-1]
        # C is free: check N and the spatial sizes of the run-time size
        picked = ctx.add(Gather(axis=0), size_ins, ctx.literal(np.array([0, *range(2, nd + 2)])))
        theta = guard(ctx, theta, picked, "equal", [tl[0], *spatial])
    else:
        if len(size) != nd + 2 or size[0] != tl[0]:
            raise ctx.error(f"size {size} does not fit theta {tl} (N, C, then {nd} sizes)")
        spatial = size[2:]
    base = affine_base_grid(spatial, bool(ctx.attr("align_corners", 0)))
    points = base.shape[0]
    base = ctx.literal(base.astype(theta.shape.dtype()))
    base = ctx.add(Multibroadcast((tl[0], points, nd + 1)), base)
    theta_t = ctx.add(Transpose((0, 2, 1)), theta)
    grid = ctx.add(Dot(), base, theta_t)
    return ctx.add(Reshape((tl[0], *spatial, nd)), grid)


# --- Col2Im -----------------------------------------------------------------------------------
@onnx_op("Col2Im", since=18)
def parse_col2im(ctx: NodeContext, args: Args) -> Instruction:
    x, image_ins, block_ins = args[:3]
    if x.shape.ndim() != 3:
        raise ctx.error(f"input {x.shape.lens()} must be [N, C * prod(block_shape), L]")
    image, block = _const_ints(ctx, image_ins), _const_ints(ctx, block_ins)
    declared = None
    if image is None or block is None:
        declared = runtime_lens(ctx, image_ins if image is None else block_ins, "image_shape")
    if image is None:
        image = declared[2:]
        x = guard(ctx, x, image_ins, "equal", image)
    nd = len(image)
    attrs = {
        "dilations": tuple(ctx.attr("dilations", (1,) * nd)),
        "pads": tuple(ctx.attr("pads", (0,) * (2 * nd))),
        "strides": tuple(ctx.attr("strides", (1,) * nd)),
    }
    if len(attrs["dilations"]) != nd or len(attrs["strides"]) != nd or len(attrs["pads"]) != 2 * nd:
        raise ctx.error(f"dilations, strides and pads need {nd}, {nd} and {2 * nd} values")
    if block is None:
        op = Col2im(image_shape=tuple(image), channels=declared[1], **attrs)
        return ctx.add(op, x, block_ins)
    if len(block) != nd:
        raise ctx.error(f"block_shape {block} and image_shape {image} differ in rank")
    return ctx.add(Col2im(image_shape=tuple(image), block_shape=tuple(block), **attrs), x)


# --- CumProd ----------------------------------------------------------------------------------
@onnx_op("CumProd", since=26)
def parse_cumprod(ctx: NodeContext, args: Args) -> Instruction:
    x, axis_ins = args[0], args[1]
    rank = x.shape.ndim()
    if rank == 0:
        raise ctx.error("input is a scalar; CumProd needs at least one axis")
    flags = {"exclusive": bool(ctx.attr("exclusive", 0)), "reverse": bool(ctx.attr("reverse", 0))}
    axis = _const_ints(ctx, axis_ins)
    if axis is None:
        return ctx.add(PrefixScanProd(**flags), x, axis_ins)
    if len(axis) != 1 or not -rank <= axis[0] < rank:
        raise ctx.error(f"axis {axis} must be one value in [{-rank}, {rank})")
    return ctx.add(PrefixScanProd(axis=axis[0] % rank, **flags), x)


# --- TensorScatter ----------------------------------------------------------------------------
@onnx_op("TensorScatter", since=24)
def parse_tensor_scatter(ctx: NodeContext, args: Args) -> Instruction:
    cache, update, write = args[0], args[1], arg(args, 2)
    mode = ctx.attr("mode", "linear")
    rank = cache.shape.ndim()
    axis = ctx.attr("axis", -2)
    if not -rank <= axis < rank or axis % rank == 0:
        raise ctx.error(f"axis {axis} must be a sequence axis (not 0) of a rank-{rank} cache")
    if mode not in ("linear", "circular"):
        raise ctx.error(f"mode {mode!r} is not linear or circular")
    op = TensorScatter(axis=axis % rank, mode=mode)
    return ctx.add(op, cache, update, *([write] if write is not None else []))


# --- BitCast ----------------------------------------------------------------------------------
@onnx_op("BitCast", since=26)
def parse_bitcast(ctx: NodeContext, args: Args) -> Instruction:
    try:
        target = onnx_type_to_shape_type(ctx.attr("to"))
    except ValueError as exc:
        raise ctx.error(str(exc)) from None
    x = args[0]
    if x.shape.type() == target:
        return x
    return ctx.add(Bitcast(target_type=target), x)  # a width mismatch is a ShapeError
