"""Handlers of ONNX normalisations: LayerNormalization, GroupNormalization, RMSNormalization,
MeanVarianceNormalization and LpNormalization.

Each is decomposed into `reduce_mean` / `reduce_sum` (which keep the reduced axes as length 1)
and pointwise IR ops, as MIGraphX's parser does, following the ONNX function bodies step by step
so the reference numbers stay close to ONNX Runtime. With `stash_type` 1, half and bf16 inputs
are normalised in float32 and cast back before scale and bias are applied, as the ONNX
definitions say.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.shape import FLOAT_TYPES
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.handlers.softmax import normalized_axis, reshape
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.base import ShapeError
from pygraphx.ops.broadcast import Broadcast, broadcast_lens
from pygraphx.ops.pointwise import Where

Args = list[Instruction | None]

# ONNX TensorProto element types allowed as stash_type
_STASH_TYPES = {1: "float_type", 10: "half_type", 11: "double_type", 16: "bf16_type"}


def _binary(ctx: NodeContext, name: str, x: Instruction, y: Instruction) -> Instruction:
    """`name(x, y)` with y multibroadcast to x's lens (y may be a reduction's keepdims result)."""
    return ctx.add(make_op(name), x, ctx.broadcast_to(y, x.shape.lens()))


def _mean(ctx: NodeContext, x: Instruction, axes: Sequence[int]) -> Instruction:
    return ctx.add(make_op("reduce_mean", axes=tuple(axes)), x)


def _float_input(ctx: NodeContext, x: Instruction) -> None:
    if x.shape.type() not in FLOAT_TYPES:
        raise ctx.error(f"input X must be a floating-point tensor, got {x.shape.type()}")


def _stash_type(ctx: NodeContext, x: Instruction) -> str:
    """The type the statistics are computed in (ONNX's stash_type, U)."""
    code = ctx.attr("stash_type", 1)
    if code not in _STASH_TYPES:
        raise ctx.error(f"stash_type {code} is not a floating-point type")
    stash = _STASH_TYPES[code]
    # never compute in less precision than the input has
    if x.shape.type() == "double_type":
        return "double_type"
    return stash


def _affine(
    ctx: NodeContext, y: Instruction, param: Instruction | None, op_name: str, what: str
) -> Instruction:
    """`y op param` with param (Scale or B) broadcast to y's lens by numpy's rules."""
    if param is None:
        return y
    lens = y.shape.lens()
    try:
        ok = broadcast_lens(param.shape.lens(), lens) == lens
    except ShapeError:
        ok = False
    if not ok:
        raise ctx.error(f"{what} of shape {param.shape.lens()} does not broadcast to {lens}")
    param = ctx.convert(param, y.shape.type())
    return ctx.add(make_op(op_name), y, ctx.broadcast_to(param, lens))


def _normalize(
    ctx: NodeContext, x: Instruction, axes: Sequence[int], epsilon: float
) -> tuple[Instruction, Instruction, Instruction]:
    """(x - mean) / sqrt(var + epsilon) over `axes`; returns (normalised, mean, 1 / stddev)."""
    mean = _mean(ctx, x, axes)
    deviation = _binary(ctx, "sub", x, mean)
    variance = _mean(ctx, ctx.add(make_op("mul"), deviation, deviation), axes)
    var_eps = ctx.add(make_op("add"), variance, ctx.scalar(epsilon, variance))
    stddev = ctx.add(make_op("sqrt"), var_eps)
    normalized = _binary(ctx, "div", deviation, stddev)
    return normalized, mean, ctx.add(make_op("recip"), stddev)


@onnx_op("LayerNormalization", since=17)
def parse_layer_normalization(ctx: NodeContext, args: Args) -> list[Instruction]:
    x = args[0]
    scale = args[1] if len(args) > 1 else None
    bias = args[2] if len(args) > 2 else None
    _float_input(ctx, x)
    rank = x.shape.ndim()
    axis = normalized_axis(ctx, ctx.attr("axis", -1), rank)
    epsilon = ctx.attr("epsilon", 1e-5)
    xs = ctx.convert(x, _stash_type(ctx, x))
    normalized, mean, inv_std = _normalize(ctx, xs, range(axis, rank), epsilon)
    y = ctx.convert(normalized, x.shape.type())
    y = _affine(ctx, y, scale, "mul", "Scale")
    y = _affine(ctx, y, bias, "add", "B")
    return [y, mean, inv_std]


@onnx_op("RMSNormalization", since=23)
def parse_rms_normalization(ctx: NodeContext, args: Args) -> Instruction:
    x, scale = args[0], args[1]
    _float_input(ctx, x)
    rank = x.shape.ndim()
    axis = normalized_axis(ctx, ctx.attr("axis", -1), rank)
    epsilon = ctx.attr("epsilon", 1e-5)
    xs = ctx.convert(x, _stash_type(ctx, x))
    mean_square = _mean(ctx, ctx.add(make_op("mul"), xs, xs), range(axis, rank))
    ms_eps = ctx.add(make_op("add"), mean_square, ctx.scalar(epsilon, mean_square))
    rms = ctx.add(make_op("sqrt"), ms_eps)
    y = ctx.convert(_binary(ctx, "div", xs, rms), x.shape.type())
    return _affine(ctx, y, scale, "mul", "Scale")


def _group_normalization(ctx: NodeContext, args: Args, per_group_affine: bool) -> Instruction:
    x, scale, bias = args[0], args[1], args[2]
    _float_input(ctx, x)
    lens = x.shape.lens()
    if len(lens) < 2:
        raise ctx.error(f"X must have rank 2 or more ([N, C, ...]), got {lens}")
    groups = ctx.attr("num_groups")
    n, c = lens[0], lens[1]
    if groups <= 0 or c % groups:
        raise ctx.error(f"num_groups {groups} does not divide the {c} channels")
    want = groups if per_group_affine else c
    for what, p in (("scale", scale), ("bias", bias)):
        if p.shape.lens() != [want]:
            raise ctx.error(f"{what} must have shape [{want}], got {p.shape.lens()}")
    epsilon = ctx.attr("epsilon", 1e-5)
    stash = _stash_type(ctx, x) if ctx.opset >= 21 else x.shape.type()
    grouped = reshape(ctx, ctx.convert(x, stash), [n, groups, prod(lens[1:]) // groups])
    normalized, _, _ = _normalize(ctx, grouped, [2], epsilon)
    y = ctx.convert(normalized, x.shape.type())
    if per_group_affine:
        out_lens = y.shape.lens()
    else:
        y = reshape(ctx, y, lens)
        out_lens = lens
    for op_name, p in (("mul", scale), ("add", bias)):
        p = ctx.add(Broadcast(axis=1, out_lens=tuple(out_lens)), ctx.convert(p, y.shape.type()))
        y = ctx.add(make_op(op_name), y, p)
    return reshape(ctx, y, lens)


@onnx_op("GroupNormalization", since=18)
def parse_group_normalization_v18(ctx: NodeContext, args: Args) -> Instruction:
    # opset 18: scale and bias hold one value per group
    return _group_normalization(ctx, args, per_group_affine=True)


@onnx_op("GroupNormalization", since=21)
def parse_group_normalization(ctx: NodeContext, args: Args) -> Instruction:
    # opset 21: scale and bias hold one value per channel
    return _group_normalization(ctx, args, per_group_affine=False)


@onnx_op("MeanVarianceNormalization", since=9)
def parse_mean_variance_normalization(ctx: NodeContext, args: Args) -> Instruction:
    # the ONNX function: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)
    x = args[0]
    _float_input(ctx, x)
    rank = x.shape.ndim()
    axes = sorted({normalized_axis(ctx, a, rank) for a in ctx.attr("axes", (0, 2, 3))})
    mul = make_op("mul")
    mean = _mean(ctx, x, axes)
    mean_of_squares = _mean(ctx, ctx.add(mul, x, x), axes)
    variance = ctx.add(make_op("sub"), mean_of_squares, ctx.add(mul, mean, mean))
    stddev = ctx.add(make_op("sqrt"), variance)
    divisor = ctx.add(make_op("add"), stddev, ctx.scalar(1e-9, stddev))
    return _binary(ctx, "div", _binary(ctx, "sub", x, mean), divisor)


@onnx_op("LpNormalization")
def parse_lp_normalization(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    _float_input(ctx, x)
    p = ctx.attr("p", 2)
    if p not in (1, 2):
        raise ctx.error(f"p must be 1 or 2, got {p}")
    axis = normalized_axis(ctx, ctx.attr("axis", -1), x.shape.ndim())
    terms = ctx.add(make_op("abs"), x) if p == 1 else ctx.add(make_op("mul"), x, x)
    norm = ctx.add(make_op("reduce_sum", axes=(axis,)), terms)
    if p == 2:
        norm = ctx.add(make_op("sqrt"), norm)
    # a zero norm divides a zero slice: divide by 1 instead, so the result is 0 (not nan)
    zero = ctx.add(make_op("equal"), norm, ctx.scalar(0, norm))
    norm = ctx.add(Where(), zero, ctx.scalar(1, norm), norm)
    return _binary(ctx, "div", x, norm)
