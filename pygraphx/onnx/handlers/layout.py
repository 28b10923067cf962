"""Handlers of ONNX shape and layout ops: Reshape, Transpose, (Un)Squeeze, Flatten, Concat,
Split, Slice, Pad, Expand and Tile (DepthToSpace, SpaceToDepth, Trilu and CenterCropPad are in
rearrange.py).

Inputs that decide an output shape (Reshape's shape, Slice's starts, Pad's pads, ...) must be
known at compile time: they are read with `ctx.require_const`, which also folds the
Shape -> Gather -> Concat chains that exporters emit. Old opsets that carried them as attributes
are handled by their own functions. A run-time value is accepted when the model declares the
output shape: the helpers of `_runtime_shapes.py` build static IR for that shape and check the
value at run time (`shape_guard`, `dynamic_slice`, `dynamic_pad`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.shape import MAX_RANK
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.handlers._runtime_shapes import guard, runtime_lens
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.base import ShapeError
from pygraphx.ops.broadcast import Multibroadcast, broadcast_lens
from pygraphx.ops.copy_ops import Concat, DynamicPad, Pad, Reverse
from pygraphx.ops.layout import (
    DynamicSlice,
    Flatten,
    Reshape,
    Slice,
    Squeeze,
    Step,
    Transpose,
    Unsqueeze,
    reshape_lens,
    slice_ranges,
)
from pygraphx.ops.pointwise import Where

Args = list[Instruction | None]


def arg(args: Args, k: int) -> Instruction | None:
    """Input `k`, or None when it is omitted (empty name or past the end)."""
    return args[k] if k < len(args) else None


def const_ints(ctx: NodeContext, ins: Instruction | None, what: str) -> list[int] | None:
    """A compile-time integer list (None when the optional input is absent)."""
    if ins is None:
        return None
    value = np.asarray(ctx.require_const(ins, what))
    if value.dtype.kind not in "iub":
        raise ctx.error(f"{what} must hold integers, got {value.dtype}")
    return [int(v) for v in value.reshape(-1)]


def norm_axis(ctx: NodeContext, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ctx.error(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def norm_axes(ctx: NodeContext, axes: Sequence[int], rank: int) -> list[int]:
    out = [norm_axis(ctx, a, rank, "axis") for a in axes]
    if len(set(out)) != len(out):
        raise ctx.error(f"axes {list(axes)} repeat an axis")
    return out


# --- Reshape ------------------------------------------------------------------------------


def reshape_to(
    ctx: NodeContext, x: Instruction, dims: Sequence[int], allowzero: bool
) -> Instruction:
    """Reshape with ONNX semantics: 0 copies the input dimension (unless allowzero), -1 infers."""
    try:
        lens = reshape_lens(x.shape.lens(), dims, allowzero)
    except ValueError as exc:
        raise ctx.error(f"cannot reshape input lens {x.shape.lens()}: {exc}") from None
    return reshape_lens_to(ctx, x, lens)


def reshape_lens_to(ctx: NodeContext, x: Instruction, lens: Sequence[int]) -> Instruction:
    """A `reshape` to the resolved `lens`; an empty result with a 0 length is a literal (the IR
    op reads a 0 in its dims as "copy the input dimension", as MIGraphX's does)."""
    if 0 in lens:
        return ctx.literal(np.zeros(lens, x.shape.dtype()))
    return ctx.add(Reshape(tuple(lens)), x)


@onnx_op("Reshape")
def parse_reshape_v1(ctx: NodeContext, args: Args) -> Instruction:
    return reshape_to(ctx, args[0], ctx.attr("shape"), False)


@onnx_op("Reshape", since=5)
def parse_reshape(ctx: NodeContext, args: Args) -> Instruction:
    x, shape = args[0], args[1]
    allowzero = bool(ctx.attr("allowzero", 0))
    dims = ctx.const(shape)
    if dims is not None:
        return reshape_to(ctx, x, [int(d) for d in np.asarray(dims).reshape(-1)], allowzero)
    lens = runtime_lens(ctx, shape, "shape")
    x = guard(ctx, x, shape, "reshape_allowzero" if allowzero else "reshape", lens)
    return reshape_lens_to(ctx, x, lens)


# --- Transpose, Squeeze, Unsqueeze, Flatten -------------------------------------------------


@onnx_op("Transpose")
def parse_transpose(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    rank = x.shape.ndim()
    perm = ctx.attr("perm", tuple(range(rank - 1, -1, -1)))
    perm = tuple(norm_axis(ctx, p, rank, "perm entry") for p in perm)
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"perm {list(perm)} is not a permutation of {rank} axes")
    if perm == tuple(range(rank)):
        return x
    return ctx.add(Transpose(perm), x)


def squeeze(ctx: NodeContext, x: Instruction, axes: Sequence[int] | None) -> Instruction:
    lens = x.shape.lens()
    if axes is None:
        axes = [k for k, n in enumerate(lens) if n == 1]
    axes = norm_axes(ctx, axes, len(lens))
    for a in axes:
        if lens[a] != 1:
            raise ctx.error(f"cannot squeeze axis {a} of input lens {lens}: its length is not 1")
    if not axes:
        return x
    return ctx.add(Squeeze(tuple(sorted(axes))), x)


def unsqueeze(ctx: NodeContext, x: Instruction, axes: Sequence[int]) -> Instruction:
    rank = x.shape.ndim() + len(axes)
    axes = norm_axes(ctx, axes, rank)
    return ctx.add(Unsqueeze(tuple(sorted(axes))), x)


@onnx_op("Squeeze")
def parse_squeeze_v1(ctx: NodeContext, args: Args) -> Instruction:
    axes = ctx.attr("axes", None)
    return squeeze(ctx, args[0], None if axes is None else list(axes))


def _runtime_axes(ctx: NodeContext, args: Args, rule: str) -> Instruction:
    """(Un)squeeze with run-time axes: reshape to the declared lens, the axes checked."""
    lens = runtime_lens(ctx, args[1], "axes")
    return reshape_lens_to(ctx, guard(ctx, args[0], args[1], rule, lens), lens)


@onnx_op("Squeeze", since=13)
def parse_squeeze(ctx: NodeContext, args: Args) -> Instruction:
    axes = arg(args, 1)
    if axes is not None and ctx.const(axes) is None:
        return _runtime_axes(ctx, args, "squeeze")
    return squeeze(ctx, args[0], const_ints(ctx, axes, "axes"))


@onnx_op("Unsqueeze")
def parse_unsqueeze_v1(ctx: NodeContext, args: Args) -> Instruction:
    return unsqueeze(ctx, args[0], ctx.attr("axes"))


@onnx_op("Unsqueeze", since=13)
def parse_unsqueeze(ctx: NodeContext, args: Args) -> Instruction:
    if ctx.const(args[1]) is None:
        return _runtime_axes(ctx, args, "unsqueeze")
    return unsqueeze(ctx, args[0], const_ints(ctx, args[1], "axes"))


@onnx_op("Flatten")
def parse_flatten(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    rank = x.shape.ndim()
    axis = ctx.attr("axis", 1)
    if not -rank <= axis <= rank:
        raise ctx.error(f"axis {axis} is out of range [-{rank}, {rank}]")
    return ctx.add(Flatten(axis + rank if axis < 0 else axis), x)


# --- Concat, Split ------------------------------------------------------------------------


@onnx_op("Concat")
def parse_concat(ctx: NodeContext, args: Args) -> Instruction:
    xs = [a for a in args if a is not None]
    if not xs:
        raise ctx.error("Concat needs at least one input")
    rank = xs[0].shape.ndim()
    axis = norm_axis(ctx, ctx.attr("axis", 1) if ctx.opset < 4 else ctx.attr("axis"), rank)
    types = {x.shape.type() for x in xs}
    if len(types) > 1:
        raise ctx.error(f"inputs have different types {sorted(types)}")
    if len(xs) == 1:
        return xs[0]
    return ctx.add(Concat(axis), *xs)


def slice_axis(ctx: NodeContext, x: Instruction, axis: int, start: int, end: int) -> Instruction:
    return ctx.add(Slice((axis,), (start,), (end,)), x)


def split(
    ctx: NodeContext, x: Instruction, axis: int, sizes: Sequence[int] | None, count: int | None
) -> list[Instruction]:
    """Split `x` along `axis` into `sizes`, or into `count` parts (the last may be smaller)."""
    lens = x.shape.lens()
    axis = norm_axis(ctx, axis, len(lens))
    n = lens[axis]
    outputs = len(ctx.node.output)
    if sizes is None:
        parts = count if count is not None else outputs
        if parts <= 0:
            raise ctx.error(f"cannot split into {parts} parts")
        chunk = -(-n // parts) if count is not None else n // parts
        if count is None and n % parts:
            raise ctx.error(f"axis {axis} of length {n} does not split into {parts} equal parts")
        sizes = [min(chunk, max(n - k * chunk, 0)) for k in range(parts)]
    if any(s < 0 for s in sizes) or sum(sizes) != n:
        raise ctx.error(f"split sizes {list(sizes)} do not add up to the length {n} of axis {axis}")
    if len(sizes) != outputs:
        raise ctx.error(f"{len(sizes)} split sizes for {outputs} outputs")
    outs = []
    start = 0
    for s in sizes:
        outs.append(slice_axis(ctx, x, axis, start, start + s))
        start += s
    return outs


@onnx_op("Split")
def parse_split_v1(ctx: NodeContext, args: Args) -> list[Instruction]:
    sizes = ctx.attr("split", None)
    if sizes is None and arg(args, 1) is not None:
        sizes = const_ints(ctx, args[1], "split")
    return split(ctx, args[0], ctx.attr("axis", 0), sizes, None)


@onnx_op("Split", since=2)
def parse_split_v2(ctx: NodeContext, args: Args) -> list[Instruction]:
    sizes = ctx.attr("split", None)
    return split(ctx, args[0], ctx.attr("axis", 0), sizes or None, None)


@onnx_op("Split", since=13)
def parse_split(ctx: NodeContext, args: Args) -> list[Instruction]:
    x, split_ins = args[0], arg(args, 1)
    axis = ctx.attr("axis", 0)
    if split_ins is not None and ctx.const(split_ins) is None:
        # run-time sizes: take them from the declared outputs, checked at run time
        a = norm_axis(ctx, axis, x.shape.ndim())
        sizes = [runtime_lens(ctx, split_ins, "split", k)[a] for k in range(len(ctx.node.output))]
        return split(ctx, guard(ctx, x, split_ins, "equal", sizes), a, sizes, None)
    sizes = const_ints(ctx, split_ins, "split")
    count = ctx.attr("num_outputs", None) if ctx.opset >= 18 else None
    if sizes is not None and count is not None:
        raise ctx.error("give either the 'split' input or the 'num_outputs' attribute, not both")
    if ctx.opset >= 18 and sizes is None and count is None:
        raise ctx.error("Split-18 needs the 'split' input or the 'num_outputs' attribute")
    return split(ctx, x, axis, sizes, count)


# --- Slice --------------------------------------------------------------------------------


def strided_slice(
    ctx: NodeContext,
    x: Instruction,
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None,
    steps: Sequence[int] | None,
) -> Instruction:
    """ONNX Slice: per-axis start/end/step with negative indices and clamping.

    Emitted as MIGraphX does: `reverse` for the negative-step axes, then `slice` (step 1), then
    `step` for steps other than +-1.
    """
    lens = x.shape.lens()
    try:
        ranges = slice_ranges(lens, starts, ends, axes, steps)
    except ValueError as exc:
        raise ctx.error(str(exc)) from None
    rev_axes, sl_axes, sl_starts, sl_ends, st_axes, st_steps = [], [], [], [], [], []
    for a, (n, (b, e, s)) in enumerate(zip(lens, ranges, strict=True)):
        if s < 0:
            # element b, b+s, ... (> e) of x is element n-1-b, n-1-b-s, ... of the reversed axis
            b, e, s = n - 1 - b, n - 1 - e, -s
            rev_axes.append(a)
        e = max(e, b)
        if (b, e) != (0, n):
            sl_axes.append(a)
            sl_starts.append(b)
            sl_ends.append(e)
        if s != 1 and e - b > 1:
            st_axes.append(a)
            st_steps.append(s)
    out = x
    if rev_axes:
        out = ctx.add(Reverse(tuple(rev_axes)), out)
    if sl_axes:
        out = ctx.add(Slice(tuple(sl_axes), tuple(sl_starts), tuple(sl_ends)), out)
    if st_axes:
        out = ctx.add(Step(tuple(st_axes), tuple(st_steps)), out)
    return out


@onnx_op("Slice")
def parse_slice_v1(ctx: NodeContext, args: Args) -> Instruction:
    starts, ends = ctx.attr("starts"), ctx.attr("ends")
    return strided_slice(ctx, args[0], starts, ends, ctx.attr("axes", None), None)


def _runtime_slice(ctx: NodeContext, x: Instruction, params: Args) -> Instruction:
    """Slice with run-time starts/ends/axes/steps: a `dynamic_slice` to the declared lens."""
    starts, ends, axes, steps = params
    dynamic = next(p for p in params if p is not None and ctx.const(p) is None)
    lens = runtime_lens(ctx, dynamic, "starts/ends/axes/steps")
    count = starts.shape.elements()
    if axes is None:
        axes = ctx.literal(np.arange(count, dtype=np.int64))
    if steps is None:
        steps = ctx.literal(np.ones(count, dtype=np.int64))
    return ctx.add(DynamicSlice(tuple(lens)), x, starts, ends, axes, steps)


@onnx_op("Slice", since=10)
def parse_slice(ctx: NodeContext, args: Args) -> Instruction:
    params = [arg(args, k) for k in range(1, 5)]
    if any(p is not None and ctx.const(p) is None for p in params):
        return _runtime_slice(ctx, args[0], params)
    starts = const_ints(ctx, args[1], "starts")
    ends = const_ints(ctx, args[2], "ends")
    axes = const_ints(ctx, arg(args, 3), "axes")
    steps = const_ints(ctx, arg(args, 4), "steps")
    return strided_slice(ctx, args[0], starts, ends, axes, steps)


# --- Pad ----------------------------------------------------------------------------------


def pad(
    ctx: NodeContext, x: Instruction, pads: Sequence[int], mode: str, value: float
) -> Instruction:
    """ONNX Pad (pads = begins then ends, one per axis); negative pads crop first."""
    lens = x.shape.lens()
    rank = len(lens)
    if len(pads) != 2 * rank:
        raise ctx.error(f"pads {list(pads)} must have 2 * rank = {2 * rank} values")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.error(f"unsupported mode {mode!r} (constant, reflect, edge, wrap)")
    begins, ends = list(pads[:rank]), list(pads[rank:])
    crop = [k for k in range(rank) if begins[k] < 0 or ends[k] < 0]
    if crop:
        starts = [max(-begins[k], 0) for k in crop]
        stops = [lens[k] - max(-ends[k], 0) for k in crop]
        if any(b > e for b, e in zip(starts, stops, strict=True)):
            raise ctx.error(f"negative pads {list(pads)} remove more than input lens {lens}")
        x = ctx.add(Slice(tuple(crop), tuple(starts), tuple(stops)), x)
    positive = tuple(max(p, 0) for p in pads)
    if not any(positive):
        return x
    if mode != "constant" and any(
        n == 0 and (b or e)
        for n, b, e in zip(x.shape.lens(), positive, positive[rank:], strict=False)
    ):
        raise ctx.error(f"{mode} padding needs a non-empty input along the padded axes")
    if mode == "reflect":
        for n, b, e in zip(x.shape.lens(), positive, positive[rank:], strict=False):
            if n > 1 and (b >= n or e >= n):
                raise ctx.error(f"reflect pads {list(pads)} must be smaller than lens {lens}")
    if x.shape.type() not in ("float_type", "half_type", "double_type", "bf16_type"):
        value = int(value)
    return ctx.add(Pad(positive, mode, value), x)


@onnx_op("Pad")
def parse_pad_v1(ctx: NodeContext, args: Args) -> Instruction:
    pads = ctx.attr("paddings") if ctx.opset < 2 else ctx.attr("pads")
    return pad(ctx, args[0], pads, ctx.attr("mode", "constant"), ctx.attr("value", 0.0))


@onnx_op("Pad", since=11)
def parse_pad(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    rank = x.shape.ndim()
    mode = ctx.attr("mode", "constant")
    params = [args[1], arg(args, 2), arg(args, 3)]
    if any(p is not None and ctx.const(p) is None for p in params):
        return _runtime_pad(ctx, x, mode, *params)
    pads = const_ints(ctx, args[1], "pads")
    value = 0.0
    if params[1] is not None:
        v = np.asarray(ctx.require_const(params[1], "constant_value")).reshape(-1)
        if v.size:
            value = v[0].item()
    axes = const_ints(ctx, params[2], "axes")
    if axes is not None:
        axes = norm_axes(ctx, axes, rank)
        if len(pads) != 2 * len(axes):
            raise ctx.error(f"pads {pads} must have 2 values per axis of {axes}")
        full = [0] * (2 * rank)
        for k, a in enumerate(axes):
            full[a] = pads[k]
            full[a + rank] = pads[k + len(axes)]
        pads = full
    return pad(ctx, x, pads, mode, value)


def _runtime_pad(
    ctx: NodeContext,
    x: Instruction,
    mode: str,
    pads: Instruction,
    value: Instruction | None,
    axes: Instruction | None,
) -> Instruction:
    """Pad with run-time pads, constant or axes: a `dynamic_pad` to the declared lens."""
    rank = x.shape.ndim()
    lens = runtime_lens(ctx, pads, "pads")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.error(f"unsupported mode {mode!r} (constant, reflect, edge, wrap)")
    if axes is not None:
        # scatter the per-axis pads into one begin and one end per dimension, at run time
        axes = ctx.convert(axes, "int64_type")
        n = axes.shape.elements()
        wrapped = ctx.add(make_op("add"), axes, ctx.scalar(rank, axes))
        neg = ctx.add(make_op("less"), axes, ctx.scalar(0, axes))
        axes = ctx.add(Where(), neg, wrapped, axes)
        where = ctx.add(Concat(0), axes, ctx.add(make_op("add"), axes, ctx.scalar(rank, axes)))
        where = ctx.add(Reshape((2 * n, 1)), where)
        zeros = ctx.literal(np.zeros(2 * rank, np.int64))
        pads = ctx.add(make_op("scatternd"), zeros, where, ctx.convert(pads, "int64_type"))
    if value is None or value.shape.elements() == 0:
        value = ctx.literal(np.zeros(1, x.shape.dtype()))
    return ctx.add(DynamicPad(mode, tuple(lens)), x, ctx.convert(pads, "int64_type"), value)


# --- Expand, Tile -------------------------------------------------------------------------


@onnx_op("Expand", since=8)
def parse_expand(ctx: NodeContext, args: Args) -> Instruction:
    x, shape = args[0], args[1]
    if ctx.const(shape) is None:
        lens = runtime_lens(ctx, shape, "shape")
        return ctx.add(Multibroadcast(tuple(lens)), guard(ctx, x, shape, "expand", lens))
    if np.size(ctx.const(shape)) > MAX_RANK:
        raise ctx.error(f"shape has {np.size(ctx.const(shape))} dimensions: at most {MAX_RANK}")
    dims = const_ints(ctx, shape, "shape")
    try:
        lens = broadcast_lens(x.shape.lens(), dims)
    except ShapeError:
        raise ctx.error(f"input lens {x.shape.lens()} cannot expand to {dims}") from None
    if lens == x.shape.lens():
        return x
    return ctx.add(Multibroadcast(tuple(lens)), x)


def tile(ctx: NodeContext, x: Instruction, repeats: Sequence[int]) -> Instruction:
    """Tile as a view and one copy: unsqueeze, multibroadcast the repeats, reshape."""
    lens = x.shape.lens()
    if len(repeats) != len(lens):
        raise ctx.error(f"repeats {list(repeats)} must have one value per axis of {lens}")
    if any(r < 0 for r in repeats):
        raise ctx.error(f"repeats {list(repeats)} must be non-negative")
    if all(r == 1 for r in repeats):
        return x
    rank = len(lens)
    up = ctx.add(Unsqueeze(tuple(2 * k for k in range(rank))), x)
    wide = [v for r, n in zip(repeats, lens, strict=True) for v in (r, n)]
    b = ctx.add(Multibroadcast(tuple(wide)), up)
    return reshape_lens_to(ctx, b, [r * n for r, n in zip(repeats, lens, strict=True)])


@onnx_op("Tile")
def parse_tile_v1(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    tiles = const_ints(ctx, args[1], "tiles")[0]
    axis = norm_axis(ctx, const_ints(ctx, args[2], "axis")[0], x.shape.ndim())
    repeats = [1] * x.shape.ndim()
    repeats[axis] = tiles
    return tile(ctx, x, repeats)


@onnx_op("Tile", since=6)
def parse_tile(ctx: NodeContext, args: Args) -> Instruction:
    x, repeats = args[0], args[1]
    if ctx.const(repeats) is None:
        lens = runtime_lens(ctx, repeats, "repeats")
        if len(lens) != x.shape.ndim():
            raise ctx.error(f"declared output lens {lens} do not match input {x.shape.lens()}")
        counts = [d // n if n else 1 for d, n in zip(lens, x.shape.lens(), strict=True)]
        return tile(ctx, guard(ctx, x, repeats, "tile", lens), counts)
    return tile(ctx, x, const_ints(ctx, repeats, "repeats"))
