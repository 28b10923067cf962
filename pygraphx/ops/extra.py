"""Remaining default-domain operators: `grid_sample`, `col2im`, `prefix_scan_prod`,
`tensor_scatter` and `bitcast`.

- `grid_sample[mode, padding_mode, align_corners]` (ONNX GridSample, N-D): samples X
  [N, C, D1..Dk] at the normalised coordinates of grid [N, O1..Ok, k] (grid[..., 0] indexes the
  last dimension), with nearest (round half to even), linear or cubic (Keys, a = -0.75)
  interpolation and zeros, border or reflection padding, as ONNX's reference and ONNX Runtime
  compute it: coordinates outside the borders are first clamped (border) or reflected
  (reflection), then every neighbour outside the image is padded by the same rule. Cubic with
  border padding clamps only the 4 neighbours of each dimension, not the coordinate, as PyTorch
  (where the op comes from) and ONNX Runtime do; ONNX's reference evaluator clamps the
  coordinate too, and no ONNX node test covers the case. Coordinates are computed in float32
  (float64 for double), as ONNX Runtime does.
- `col2im[image_shape, block_shape, dilations, pads, strides]` (ONNX Col2Im): sums the column
  blocks of [N, C * prod(block), L] into [N, C, *image_shape]. With `block_shape` empty the block
  shape is a run-time input (input 1) and `channels` gives C.
- `prefix_scan_prod[axis, exclusive, reverse]` (ONNX CumProd), in the input's type; the axis may
  instead be a run-time input (input 1).
- `tensor_scatter[axis, mode]` (ONNX TensorScatter): writes `update` into a copy of the cache at
  each batch's write index along `axis` (`circular` wraps around the cache length).
- `bitcast[target_type]` (ONNX BitCast): the same bytes read as another type of the same width.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from pygraphx.ir.shape import FLOAT_TYPES, Shape, to_dtype
from pygraphx.ops.base import OneInputOp, Op, ShapeError, check_arity, normalize_axis, register_op

INDEX_TYPES = ("int32_type", "int64_type")

# --- GridSample -------------------------------------------------------------------------------
GRID_MODES = ("nearest", "linear", "cubic")
PADDING_MODES = ("zeros", "border", "reflection")


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect coordinates at the borders [lo, hi] until they fall inside."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    with np.errstate(invalid="ignore"):
        below, above = x < lo, x > hi
        d = np.where(below, lo - x, x - hi)
        n = np.trunc(d / x.dtype.type(span))
        r = d - n * x.dtype.type(span)
        even = np.fmod(n, 2) == 0
        from_below = np.where(even, lo + r, hi - r)
        from_above = np.where(even, hi - r, lo + r)
    return np.where(below, from_below, np.where(above, from_above, x)).astype(x.dtype)


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """Keys' cubic convolution weights (a = -0.75) of the 4 neighbours x0-1..x0+2."""
    a = t.dtype.type(-0.75)
    t = np.abs(t)
    one = t.dtype.type(1)
    w0 = ((a * (t + one) - 5 * a) * (t + one) + 8 * a) * (t + one) - 4 * a
    w1 = ((a + 2) * t - (a + 3)) * t * t + one
    w2 = ((a + 2) * (one - t) - (a + 3)) * (one - t) * (one - t) + one
    w3 = ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a
    return [w0, w1, w2, w3]


def grid_sample(
    x: np.ndarray, grid: np.ndarray, mode: str, padding_mode: str, align_corners: bool
) -> np.ndarray:
    """The reference semantics of `grid_sample` (see the module docstring)."""
    dt = np.float64 if x.dtype == np.float64 else np.float32
    nd = x.ndim - 2
    dims = x.shape[2:]
    grid = np.asarray(grid).astype(dt)
    # channels last, so one fancy index fetches every channel: [N, D1..Dk, C]
    xt = np.moveaxis(np.asarray(x).astype(dt), 1, -1)
    batch = np.arange(x.shape[0]).reshape((-1,) + (1,) * (grid.ndim - 2))
    coords, borders = [], []
    for i, size in enumerate(dims):
        n = grid[..., nd - 1 - i]
        if align_corners:
            c = (n + dt(1)) / dt(2) * dt(size - 1)
            lo, hi = 0.0, float(size - 1)
        else:
            c = ((n + dt(1)) * dt(size) - dt(1)) / dt(2)
            lo, hi = -0.5, size - 0.5
        if mode == "nearest":
            c = np.rint(c)
        outside = (c < lo) | (c > hi)
        if padding_mode == "border" and mode == "cubic":
            pass  # only the 4 taps are clamped (PyTorch and ONNX Runtime; see the module)
        elif padding_mode == "border":
            c = np.where(outside, np.clip(c, 0, size - 1), c)
        elif padding_mode == "reflection":
            c = np.where(outside, _reflect(c, lo, hi), c)
        coords.append(c.astype(dt))
        borders.append((lo, hi))

    def fetch(indices: list[np.ndarray]) -> np.ndarray:
        """Pixels at integer indices [N, O...], padded per dimension: [N, O..., C]."""
        valid = np.ones(indices[0].shape, bool)
        fixed = []
        for i, (idx, size) in enumerate(zip(indices, dims, strict=True)):
            if padding_mode == "zeros":
                valid &= (idx >= 0) & (idx < size)
                idx = np.clip(idx, 0, size - 1)
            elif padding_mode == "border":
                idx = np.clip(idx, 0, size - 1)
            else:
                lo, hi = borders[i]
                idx = np.trunc(_reflect(idx.astype(dt), lo, hi)).astype(np.int64)
                idx = np.clip(idx, 0, size - 1)
            fixed.append(idx)
        vals = xt[(batch, *fixed)]
        return np.where(valid[..., None], vals, dt(0))

    if mode == "nearest":
        out = fetch([c.astype(np.int64) for c in coords])
    else:
        base = [np.floor(c) for c in coords]
        frac = [(c - b).astype(dt) for c, b in zip(coords, base, strict=True)]
        if mode == "linear":
            offsets = (0, 1)
            weights = [[dt(1) - f, f] for f in frac]
        else:
            offsets = (-1, 0, 1, 2)
            weights = [_cubic_weights(f) for f in frac]
        out = np.zeros((*coords[0].shape, x.shape[1]), dt)
        for combo in itertools.product(range(len(offsets)), repeat=nd):
            w = np.ones(coords[0].shape, dt)
            for i, k in enumerate(combo):
                w = w * weights[i][k]
            idx = [(base[i] + offsets[k]).astype(np.int64) for i, k in enumerate(combo)]
            out += w[..., None] * fetch(idx)
    return np.moveaxis(out, -1, 1)


@register_op
class GridSample(Op):
    """ONNX GridSample on X [N, C, D1..Dk] and grid [N, O1..Ok, k] -> [N, C, O1..Ok]."""

    name = "grid_sample"
    mode: str = "linear"
    padding_mode: str = "zeros"
    align_corners: bool = False

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2)
        x, grid = inputs
        xl, gl = x.lens(), grid.lens()
        nd = len(xl) - 2
        if nd < 1 or len(gl) != nd + 2 or gl[0] != xl[0] or gl[-1] != nd:
            raise ShapeError(
                f"grid_sample: X {xl} and grid {gl} must be [N, C, D1..Dk] and [N, O1..Ok, k]"
            )
        if x.type() not in FLOAT_TYPES or grid.type() not in FLOAT_TYPES:
            raise ShapeError(
                f"grid_sample: X and grid must be float, got {x.type()}, {grid.type()}"
            )
        if self.mode not in GRID_MODES or self.padding_mode not in PADDING_MODES:
            raise ShapeError(
                f"grid_sample: mode {self.mode!r} / padding_mode {self.padding_mode!r} must be "
                f"one of {GRID_MODES} / {PADDING_MODES}"
            )
        return Shape(x.type(), xl[:2] + gl[1:-1])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        out = grid_sample(args[0], args[1], self.mode, self.padding_mode, self.align_corners)
        return out.astype(output_shape.dtype())


# --- Col2Im -----------------------------------------------------------------------------------
def col2im_blocks(
    image: Sequence[int],
    block: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
    strides: Sequence[int],
) -> list[int]:
    """The number of sliding blocks along each image dimension."""
    nd = len(image)
    return [
        (image[i] + pads[i] + pads[i + nd] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
        for i in range(nd)
    ]


def col2im(
    x: np.ndarray,
    image: Sequence[int],
    block: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
    strides: Sequence[int],
) -> np.ndarray:
    """ONNX Col2Im: [N, C * prod(block), L] column blocks summed into [N, C, *image]."""
    nd = len(image)
    n, cols, length = x.shape
    kernel = int(np.prod(block))
    blocks = col2im_blocks(image, block, dilations, pads, strides)
    if kernel < 1 or cols % kernel or int(np.prod(blocks)) != length or min(blocks) < 1:
        raise ValueError(
            f"col2im: input {list(x.shape)} does not hold blocks {list(block)} sliding over "
            f"{list(image)} ({blocks} positions, stride {list(strides)}, pads {list(pads)}, "
            f"dilations {list(dilations)})"
        )
    data = x.reshape(n, cols // kernel, *block, *blocks)
    padded = [image[i] + pads[i] + pads[i + nd] for i in range(nd)]
    out = np.zeros((n, cols // kernel, *padded), x.dtype)
    for offset in itertools.product(*(range(b) for b in block)):
        where = tuple(
            slice(o * d, o * d + (nb - 1) * s + 1, s)
            for o, d, nb, s in zip(offset, dilations, blocks, strides, strict=True)
        )
        out[(slice(None), slice(None), *where)] += data[(slice(None), slice(None), *offset)]
    crop = tuple(slice(pads[i], pads[i] + image[i]) for i in range(nd))
    return np.ascontiguousarray(out[(slice(None), slice(None), *crop)])


@register_op
class Col2im(Op):
    """ONNX Col2Im (see the module docstring)."""

    name = "col2im"
    image_shape: tuple[int, ...] = ()
    block_shape: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    channels: int = 0

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        x = inputs[0]
        nd = len(self.image_shape)
        check_arity(self, inputs, 1 if self.block_shape else 2)
        lens = x.lens()
        if len(lens) != 3 or nd < 1:
            raise ShapeError(f"col2im: input {lens} must be [N, C * prod(block), L]")
        if any(
            len(v) != k for v, k in ((self.dilations, nd), (self.strides, nd), (self.pads, 2 * nd))
        ):
            raise ShapeError(
                f"col2im: dilations, strides and pads must have {nd}, {nd}, {2 * nd} values"
            )
        if self.block_shape:
            if len(self.block_shape) != nd:
                raise ShapeError(f"col2im: block_shape {list(self.block_shape)} needs {nd} values")
            kernel = int(np.prod(self.block_shape))
            blocks = col2im_blocks(
                self.image_shape, self.block_shape, self.dilations, self.pads, self.strides
            )
            if lens[1] % kernel or int(np.prod(blocks)) != lens[2]:
                raise ShapeError(
                    f"col2im: input {lens} does not hold blocks {list(self.block_shape)} sliding "
                    f"over {list(self.image_shape)} ({blocks} positions)"
                )
            channels = lens[1] // kernel
        else:
            if inputs[1].type() not in INDEX_TYPES or inputs[1].lens() != [nd]:
                raise ShapeError(f"col2im: the block shape input must be {nd} integers")
            channels = self.channels
        return Shape(x.type(), [lens[0], channels, *self.image_shape])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        block = self.block_shape or tuple(int(v) for v in np.asarray(args[1]).reshape(-1))
        x = np.asarray(args[0])
        return col2im(x, self.image_shape, block, self.dilations, self.pads, self.strides)


# --- CumProd ----------------------------------------------------------------------------------
def cumprod(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """ONNX CumProd in the input's type."""
    if reverse:
        x = np.flip(x, axis=axis)
    with np.errstate(all="ignore"):
        out = np.cumprod(x, axis=axis, dtype=x.dtype)
    if exclusive:
        ones = np.ones_like(np.take(out, [0], axis=axis))
        out = np.concatenate([ones, np.take(out, np.arange(out.shape[axis] - 1), axis=axis)], axis)
    if reverse:
        out = np.flip(out, axis=axis)
    return np.ascontiguousarray(out)


@register_op
class PrefixScanProd(Op):
    """Cumulative product along `axis` (ONNX CumProd); `exclusive` leaves out the element
    itself, `reverse` multiplies from the end. With two inputs the axis is input 1."""

    name = "prefix_scan_prod"
    axis: int = 0
    exclusive: bool = False
    reverse: bool = False

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 1, 2)
        s = inputs[0]
        if s.ndim() == 0:
            raise ShapeError("prefix_scan_prod: the input is a scalar; it needs at least one axis")
        if len(inputs) == 2:
            if inputs[1].type() not in INDEX_TYPES or inputs[1].elements() != 1:
                raise ShapeError(
                    f"prefix_scan_prod: the axis input must be one integer: {inputs[1]}"
                )
        else:
            normalize_axis(self, self.axis, s.ndim())
        return Shape(s.type(), s.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = np.asarray(args[0])
        axis = int(np.asarray(args[1]).reshape(-1)[0]) if len(args) == 2 else self.axis
        axis = normalize_axis(self, axis, x.ndim)
        return cumprod(x, axis, self.exclusive, self.reverse).astype(output_shape.dtype())


# --- TensorScatter ----------------------------------------------------------------------------
def tensor_scatter(
    cache: np.ndarray, update: np.ndarray, write: np.ndarray | None, axis: int, circular: bool
) -> np.ndarray:
    """ONNX TensorScatter: `update` written into a copy of `cache` at each batch's index."""
    out = np.array(cache, copy=True)
    max_len, seq = cache.shape[axis], update.shape[axis]
    starts = np.zeros(cache.shape[0], np.int64) if write is None else np.asarray(write, np.int64)
    for b in range(cache.shape[0]):
        pos = int(starts[b]) + np.arange(seq)
        if circular:
            pos %= max_len
        elif seq and (pos[0] < 0 or pos[-1] >= max_len):
            raise IndexError(
                f"tensor_scatter: batch {b} writes positions {int(pos[0])}..{int(pos[-1])} of a "
                f"cache of length {max_len} (linear mode)"
            )
        index = [slice(None)] * (cache.ndim - 1)
        index[axis - 1] = pos
        out[b][tuple(index)] = update[b]
    return out


@register_op
class TensorScatter(Op):
    """ONNX TensorScatter: inputs past_cache, update and optionally write_indices [batch]."""

    name = "tensor_scatter"
    axis: int = -2
    mode: str = "linear"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2, 3)
        cache, update = inputs[:2]
        cl, ul = cache.lens(), update.lens()
        axis = normalize_axis(self, self.axis, cache.ndim())
        if axis == 0:
            raise ShapeError("tensor_scatter: the sequence axis cannot be 0 (the batch axis)")
        if self.mode not in ("linear", "circular"):
            raise ShapeError(f"tensor_scatter: mode {self.mode!r} is not linear or circular")
        if (
            len(ul) != len(cl)
            or any(u != c for k, (u, c) in enumerate(zip(ul, cl, strict=True)) if k != axis)
            or ul[axis] > cl[axis]
        ):
            raise ShapeError(
                f"tensor_scatter: update {ul} does not fit the cache {cl} on axis {axis}"
            )
        if cache.type() != update.type():
            raise ShapeError(
                f"tensor_scatter: cache {cache.type()} and update {update.type()} differ"
            )
        if len(inputs) == 3 and (inputs[2].lens() != cl[:1] or inputs[2].type() not in INDEX_TYPES):
            raise ShapeError(f"tensor_scatter: write_indices must be {cl[:1]} integers")
        return Shape(cache.type(), cl)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        cache, update = np.asarray(args[0]), np.asarray(args[1])
        write = args[2] if len(args) == 3 else None
        axis = normalize_axis(self, self.axis, cache.ndim)
        return tensor_scatter(cache, update, write, axis, self.mode == "circular")


# --- BitCast ----------------------------------------------------------------------------------
@register_op
class Bitcast(OneInputOp):
    """The input's bytes reinterpreted as `target_type`, which must have the same width."""

    name = "bitcast"
    target_type: str = "int32_type"

    def shape_for(self, s: Shape) -> Shape:
        if to_dtype(self.target_type).itemsize != s.type_size():
            raise ShapeError(
                f"bitcast: {s.type()} ({s.type_size() * 8} bits) and {self.target_type} "
                f"({to_dtype(self.target_type).itemsize * 8} bits) differ in width"
            )
        return Shape(self.target_type, s.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = np.array(args[0], order="C", copy=True)
        return x.view(output_shape.dtype())
