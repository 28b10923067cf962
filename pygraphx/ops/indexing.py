"""Indexing operators: the gather and scatter families, and `resize` (interpolating gather).

Indices are int32 or int64; a negative index counts from the end of its axis (ONNX's rule), and
an index outside [-n, n) is an error at run time. Scatter outputs are new buffers (the data input
is never written). `resize` implements ONNX Resize: nearest (four rounding modes), linear and
cubic interpolation with every coordinate transformation, separably along each resized axis.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pygraphx.ir.shape import FLOAT_TYPES, Shape
from pygraphx.ops.base import Op, ShapeError, check_arity, register_op

INDEX_TYPES = ("int32_type", "int64_type")
REDUCTIONS = ("none", "add", "mul", "max", "min")


def _axis(op: Op, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"{op.name}: axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _check_indices(op: Op, s: Shape) -> None:
    if s.type() not in INDEX_TYPES:
        raise ShapeError(f"{op.name}: indices must be int32_type or int64_type, got {s.type()}")


def _data_indices_axis(op: Op, inputs: Sequence[Shape]) -> tuple[Shape, Shape, int]:
    """The data and indices shapes of a gather-like op, checked, and its axis made >= 0."""
    check_arity(op, inputs, 2)
    data, idx = inputs
    _check_indices(op, idx)
    return data, idx, _axis(op, op.axis, data.ndim())  # type: ignore[attr-defined]


def wrap_indices(op: Op, indices: np.ndarray, n: int | np.ndarray) -> np.ndarray:
    """Indices with negatives counted from the end; IndexError when any is out of range."""
    idx = np.asarray(indices).astype(np.int64)
    bad = (idx < -n) | (idx >= n)
    if np.any(bad):
        first = idx[bad].reshape(-1)[0]
        limit = n if np.ndim(n) == 0 else np.broadcast_to(n, idx.shape)[bad].reshape(-1)[0]
        raise IndexError(
            f"{op.name}: index {int(first)} is out of range for a dimension of {limit} "
            f"(valid indices: -{limit} to {limit - 1})"
        )
    return np.where(idx < 0, idx + n, idx)


@register_op
class Gather(Op):
    """`data` indexed along `axis` by `indices`: out lens = lens[:axis] + idx + lens[axis+1:]."""

    name = "gather"
    axis: int = 0

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        data, idx, axis = _data_indices_axis(self, inputs)
        lens = data.lens()
        return Shape(data.type(), lens[:axis] + idx.lens() + lens[axis + 1 :])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        data, idx = args
        axis = _axis(self, self.axis, data.ndim)
        return np.take(data, wrap_indices(self, idx, data.shape[axis]), axis=axis)


@register_op
class GatherElements(Op):
    """out[i][j][k] = data[idx[i][j][k]][j][k] along `axis` (output lens are the indices')."""

    name = "gather_elements"
    axis: int = 0

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        data, idx, axis = _data_indices_axis(self, inputs)
        if idx.ndim() != data.ndim():
            raise ShapeError(
                f"gather_elements: indices rank {idx.ndim()} differs from data rank {data.ndim()}"
            )
        for k, (n, m) in enumerate(zip(data.lens(), idx.lens(), strict=True)):
            if k != axis and m > n:
                raise ShapeError(
                    f"gather_elements: indices lens {idx.lens()} exceed data lens {data.lens()} "
                    f"outside axis {axis}"
                )
        return Shape(data.type(), idx.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        data, idx = args
        axis = _axis(self, self.axis, data.ndim)
        idx = wrap_indices(self, idx, data.shape[axis])
        # take_along_axis needs equal lens outside the axis: crop data to the indices' lens
        crop = tuple(slice(None) if k == axis else slice(0, m) for k, m in enumerate(idx.shape))
        return np.take_along_axis(data[crop], idx, axis=axis)


def _gathernd_parts(op: Op, data: Shape, idx: Shape, batch_dims: int) -> tuple[int, list[int]]:
    _check_indices(op, idx)
    r, q = data.ndim(), idx.ndim()
    if q < 1:
        raise ShapeError(f"{op.name}: indices must have rank >= 1")
    k = idx.lens()[-1]
    if batch_dims < 0 or batch_dims >= min(r, q):
        raise ShapeError(f"{op.name}: batch_dims {batch_dims} must be in [0, min({r}, {q}))")
    if data.lens()[:batch_dims] != idx.lens()[:batch_dims]:
        raise ShapeError(
            f"{op.name}: the first {batch_dims} lens of data {data.lens()} and indices "
            f"{idx.lens()} differ"
        )
    if k > r - batch_dims:
        raise ShapeError(
            f"{op.name}: index tuples of length {k} exceed the data rank {r} less batch_dims "
            f"{batch_dims}"
        )
    return k, idx.lens()[:-1] + data.lens()[batch_dims + k :]


@register_op
class Gathernd(Op):
    """Gather slices of `data` addressed by the last axis of `indices` (ONNX GatherND)."""

    name = "gathernd"
    batch_dims: int = 0

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2)
        data, idx = inputs
        _, lens = _gathernd_parts(self, data, idx, self.batch_dims)
        return Shape(data.type(), lens)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        data, idx = args
        b = self.batch_dims
        k = idx.shape[-1]
        limits = np.asarray(data.shape[b : b + k], dtype=np.int64)
        idx = wrap_indices(self, idx, limits)
        batch = int(np.prod(data.shape[:b], dtype=np.int64))
        data_b = data.reshape((batch,) + data.shape[b:])
        idx_b = idx.reshape((batch, -1, k))
        rows = np.arange(batch)[:, None]
        out = data_b[(rows,) + tuple(idx_b[..., j] for j in range(k))]
        return out.reshape(output_shape.lens())


def _scatter_into(out: np.ndarray, where: tuple, updates: np.ndarray, reduction: str) -> None:
    """out[where] (op)= updates, applying duplicates in order."""
    if reduction == "none":
        out[where] = updates
    elif reduction == "add":
        np.add.at(out, where, updates)
    elif reduction == "mul":
        np.multiply.at(out, where, updates)
    elif reduction == "max":
        np.maximum.at(out, where, updates)
    elif reduction == "min":
        np.minimum.at(out, where, updates)
    else:
        raise ValueError(f"unknown scatter reduction {reduction!r}; known: {REDUCTIONS}")


def _check_reduction(op: Op, reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ShapeError(f"{op.name}: unknown reduction {reduction!r}; known: {list(REDUCTIONS)}")


def _scatter_inputs(op: Op, inputs: Sequence[Shape]) -> tuple[Shape, Shape, Shape]:
    """data, indices and updates of a scatter op, with the indices' type and the reduction
    checked."""
    check_arity(op, inputs, 3)
    data, idx, upd = inputs
    _check_indices(op, idx)
    _check_reduction(op, op.reduction)  # type: ignore[attr-defined]
    return data, idx, upd


def _scatter_result(op: Op, data: Shape, upd: Shape) -> Shape:
    """A scatter's output: data's shape, once the updates are checked to be of data's type."""
    if upd.type() != data.type():
        raise ShapeError(
            f"{op.name}: updates type {upd.type()} differs from data type {data.type()}"
        )
    return Shape(data.type(), data.lens())


@register_op
class ScatterElements(Op):
    """A copy of `data` with `updates` written at `indices` along `axis` (optionally reduced)."""

    name = "scatter_elements"
    axis: int = 0
    reduction: str = "none"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        data, idx, upd = _scatter_inputs(self, inputs)
        _axis(self, self.axis, data.ndim())
        if idx.lens() != upd.lens():
            raise ShapeError(
                f"scatter_elements: indices lens {idx.lens()} differ from updates lens {upd.lens()}"
            )
        if idx.ndim() != data.ndim():
            raise ShapeError(
                f"scatter_elements: indices rank {idx.ndim()} differs from data rank {data.ndim()}"
            )
        return _scatter_result(self, data, upd)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        data, idx, upd = args
        axis = _axis(self, self.axis, data.ndim)
        idx = wrap_indices(self, idx, data.shape[axis])
        grid = list(np.indices(idx.shape, sparse=True))
        grid[axis] = idx
        out = np.array(data, copy=True, order="C")
        _scatter_into(out, tuple(grid), np.asarray(upd), self.reduction)
        return out


@register_op
class Scatternd(Op):
    """A copy of `data` with slices of `updates` written at the index tuples of `indices`."""

    name = "scatternd"
    reduction: str = "none"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        data, idx, upd = _scatter_inputs(self, inputs)
        k = idx.lens()[-1] if idx.ndim() else 0
        if idx.ndim() < 1 or k > data.ndim():
            raise ShapeError(
                f"scatternd: indices lens {idx.lens()} do not address data lens {data.lens()}"
            )
        want = idx.lens()[:-1] + data.lens()[k:]
        if upd.lens() != want:
            raise ShapeError(
                f"scatternd: updates lens {upd.lens()} must be {want} for data {data.lens()} and "
                f"indices {idx.lens()}"
            )
        return _scatter_result(self, data, upd)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        data, idx, upd = args
        k = idx.shape[-1]
        idx = wrap_indices(self, idx, np.asarray(data.shape[:k], dtype=np.int64))
        out = np.array(data, copy=True, order="C")
        where = tuple(idx[..., j] for j in range(k))
        _scatter_into(out, where, np.asarray(upd), self.reduction)
        return out


@register_op
class Compress(Op):
    """The slices of `x` along `axis` where the condition (input 1, bool, read at run time) is
    true; the count of true values must be `length`, the static output length."""

    name = "compress"
    axis: int = 0
    length: int = 0

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2)
        s, cond = inputs
        axis = _axis(self, self.axis, s.ndim())
        if cond.ndim() != 1 or cond.lens()[0] > s.lens()[axis]:
            raise ShapeError(
                f"compress: condition lens {cond.lens()} do not fit axis {axis} of {s.lens()}"
            )
        lens = s.lens()
        lens[axis] = self.length
        return Shape(s.type(), lens)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, cond = args
        axis = _axis(self, self.axis, x.ndim)
        return np.compress(np.asarray(cond).astype(bool), x, axis=axis)


# --- resize -------------------------------------------------------------------------------

RESIZE_MODES = ("nearest", "linear", "cubic")
# "simple" is Resize-10 / Upsample: floor when upsampling an axis, ceil when downsampling it
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
)


def source_coordinates(
    mode: str, out_len: int, in_len: int, scale: float, roi: tuple[float, float] = (0.0, 1.0)
) -> np.ndarray:
    """Input coordinate of each output position along one axis (ONNX Resize's transformation).

    `scale` is the axis' scale factor. As the ONNX specification (and ONNX Runtime and MIGraphX)
    define it, align_corners, pytorch_half_pixel and tf_crop_and_resize use the integer output
    length, while half_pixel_symmetric corrects for the fractional one, `scale * in_len`.
    """
    y = np.arange(out_len, dtype=np.float64)
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / (scale * in_len))
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if out_len > 1 else np.zeros(out_len)
    if mode == "align_corners":
        return y * (in_len - 1) / (out_len - 1) if out_len > 1 else np.zeros(out_len)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if out_len > 1:
            x = y * (end - start) * (in_len - 1) / (out_len - 1)
        else:
            x = np.full(out_len, (end - start) * (in_len - 1) / 2)
        return x + start * (in_len - 1)
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")


def nearest_index(x: np.ndarray, mode: str, in_len: int, scale: float = 1.0) -> np.ndarray:
    """The nearest input index of each coordinate under `mode`, clamped to the axis."""
    if mode == "simple":
        mode = "ceil" if scale < 1 else "floor"
    if mode == "round_prefer_floor":
        idx = np.ceil(x - 0.5)
    elif mode == "round_prefer_ceil":
        idx = np.floor(x + 0.5)
    elif mode == "floor":
        idx = np.floor(x)
    elif mode == "ceil":
        idx = np.ceil(x)
    else:
        raise ValueError(f"unknown nearest_mode {mode!r}")
    return np.clip(idx, 0, in_len - 1).astype(np.int64)


def _cubic_kernel(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def interpolation_weights(
    x: np.ndarray,
    in_len: int,
    mode: str,
    scale: float,
    cubic_coeff_a: float = -0.75,
    exclude_outside: bool = False,
    antialias: bool = False,
) -> np.ndarray:
    """A dense [out_len, in_len] matrix: output k is sum_j W[k, j] * input[j] along the axis.

    Taps outside the axis repeat the edge value, unless `exclude_outside` drops them (and the
    rest are renormalised). With `antialias` and a downscale the kernel is stretched by 1/scale.
    """
    radius = 1 if mode == "linear" else 2
    stretch = min(scale, 1.0) if antialias else 1.0
    reach = int(np.floor(radius / stretch))
    base = np.floor(x).astype(np.int64)
    offsets = np.arange(-reach, reach + 2)
    taps = base[:, None] + offsets[None, :]  # [out, taps]
    dist = (taps - x[:, None]) * stretch
    if mode == "linear":
        w = np.clip(1 - np.abs(dist), 0, None)
    else:
        w = _cubic_kernel(dist, cubic_coeff_a)
    # the kernels vanish beyond their radius, so extra taps weigh nothing; taps outside the
    # axis repeat the edge value (clamped below) unless excluded
    if exclude_outside:
        w = np.where((taps < 0) | (taps >= in_len), 0.0, w)
    if antialias or exclude_outside:
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    out = np.zeros((len(x), in_len))
    rows = np.broadcast_to(np.arange(len(x))[:, None], taps.shape)
    np.add.at(out, (rows, np.clip(taps, 0, in_len - 1)), w)
    return out


def resolve_resize(
    lens: Sequence[int],
    axes: Sequence[int],
    scales: Sequence[float] | None,
    sizes: Sequence[int] | None,
    policy: str = "stretch",
) -> tuple[list[int], list[float]]:
    """Output lens and per-dimension scales of ONNX Resize from its scales or sizes on `axes`.

    With scales, a length is floor(n * scale) (the scale as the float32 the model stores).
    With sizes, the scale is size / n; keep_aspect_ratio_policy not_larger / not_smaller uses
    one scale for every axis (the smallest / largest) and rounds the lengths half up.
    Raises ValueError when the values do not fit.
    """
    rank = len(lens)
    out_lens, out_scales = [int(n) for n in lens], [1.0] * rank
    if scales is not None:
        if len(scales) != len(axes):
            raise ValueError(f"scales {list(scales)} need one value per axis of {list(axes)}")
        if any(not f > 0 for f in scales):
            raise ValueError(f"scales {list(scales)} must be positive")
        for a, f in zip(axes, scales, strict=True):
            out_scales[a] = float(f)
            out_lens[a] = int(np.floor(lens[a] * float(np.float32(f))))
        return out_lens, out_scales
    if sizes is None:
        raise ValueError("Resize needs either scales or sizes")
    if len(sizes) != len(axes):
        raise ValueError(f"sizes {list(sizes)} need one value per axis of {list(axes)}")
    if any(lens[a] == 0 for a in axes):
        raise ValueError(f"cannot resize the empty lens {list(lens)} to sizes")
    ratios = [int(n) / lens[a] for a, n in zip(axes, sizes, strict=True)]
    if policy == "stretch":
        for a, n, r in zip(axes, sizes, ratios, strict=True):
            out_lens[a], out_scales[a] = int(n), r
    elif policy in ("not_larger", "not_smaller"):
        r = min(ratios) if policy == "not_larger" else max(ratios)
        for a in axes:
            out_scales[a] = r
            out_lens[a] = int(r * lens[a] + 0.5)
    else:
        raise ValueError(f"unknown keep_aspect_ratio_policy {policy!r}")
    return out_lens, out_scales


def resolve_roi(rank: int, axes: Sequence[int], roi: Sequence[float]) -> tuple[float, ...]:
    """tf_crop_and_resize's roi ([starts, ends] over `axes`) for every dimension."""
    if len(roi) != 2 * len(axes):
        raise ValueError(f"roi {list(roi)} needs 2 values per axis of {list(axes)}")
    box = [0.0] * rank + [1.0] * rank
    for k, a in enumerate(axes):
        box[a], box[a + rank] = float(roi[k]), float(roi[k + len(axes)])
    return tuple(box)


@register_op
class Resize(Op):
    """ONNX Resize on a tensor, with every parameter resolved to one value per dimension.

    `sizes` are the output lens, `scales` the scale of each dimension used by the coordinate
    transformation, `roi` the [starts..., ends...] box of tf_crop_and_resize.

    With 4 inputs (x, roi, scales, sizes; empty tensors where absent) the parameters are read at
    run time instead, on `axes` with `keep_aspect_ratio_policy`, as ONNX Resize-18 defines them;
    the lens they give must be `sizes`.
    """

    name = "resize"
    sizes: tuple[int, ...] = ()
    scales: tuple[float, ...] = ()
    mode: str = "nearest"
    coordinate_transformation_mode: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_coeff_a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0
    antialias: bool = False
    roi: tuple[float, ...] = ()
    axes: tuple[int, ...] = ()
    keep_aspect_ratio_policy: str = "stretch"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 1, 4)
        s = inputs[0]
        rank = s.ndim()
        if len(self.sizes) != rank or len(self.scales) != rank:
            raise ShapeError(
                f"resize: sizes {list(self.sizes)} and scales {list(self.scales)} need one value "
                f"per dimension of {s.lens()}"
            )
        if self.roi and len(self.roi) != 2 * rank:
            raise ShapeError(f"resize: roi {list(self.roi)} needs 2 * {rank} values")
        if self.mode not in RESIZE_MODES:
            raise ShapeError(f"resize: unknown mode {self.mode!r}; known: {list(RESIZE_MODES)}")
        if self.nearest_mode not in NEAREST_MODES:
            raise ShapeError(f"resize: unknown nearest_mode {self.nearest_mode!r}")
        if self.coordinate_transformation_mode not in COORDINATE_MODES:
            raise ShapeError(
                "resize: unknown coordinate_transformation_mode "
                f"{self.coordinate_transformation_mode!r}"
            )
        if any(x <= 0 for x in self.scales):
            raise ShapeError(f"resize: scales {list(self.scales)} must be positive")
        if any(n == 0 for n in s.lens()) and any(n > 0 for n in self.sizes):
            raise ShapeError(f"resize: cannot resize the empty input {s.lens()}")
        if len(inputs) == 4 and any(a < 0 or a >= rank for a in self.axes):
            raise ShapeError(f"resize: axes {list(self.axes)} out of range for rank {rank}")
        return Shape(s.type(), self.sizes)

    def _runtime_parameters(
        self, x: np.ndarray, roi: np.ndarray, scales: np.ndarray, sizes: np.ndarray
    ) -> tuple[list[float], tuple[float, ...]]:
        axes = list(self.axes) or list(range(x.ndim))
        f = [float(v) for v in np.asarray(scales).reshape(-1)] or None
        n = [int(v) for v in np.asarray(sizes).reshape(-1)] or None
        lens, scale = resolve_resize(
            list(x.shape), axes, f, None if f else n, self.keep_aspect_ratio_policy
        )
        if lens != list(self.sizes):
            raise ValueError(
                f"resize: the run-time scales {f} / sizes {n} give lens {lens}, but the program "
                f"was compiled for {list(self.sizes)}"
            )
        box = self.roi
        if self.coordinate_transformation_mode == "tf_crop_and_resize":
            box = resolve_roi(x.ndim, axes, [float(v) for v in np.asarray(roi).reshape(-1)])
        return scale, box

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        rank = x.ndim
        scales, roi = list(self.scales), self.roi
        if len(args) == 4:
            scales, roi = self._runtime_parameters(x, *args[1:])
        roi = roi or (0.0,) * rank + (1.0,) * rank
        crop = self.coordinate_transformation_mode == "tf_crop_and_resize"
        out = x if self.mode == "nearest" else x.astype(np.float64)
        outside_mask = None
        for axis in range(rank):
            in_len, out_len, scale = x.shape[axis], self.sizes[axis], float(scales[axis])
            box = (float(roi[axis]), float(roi[axis + rank]))
            if out_len == in_len and scale == 1.0 and (not crop or box == (0.0, 1.0)):
                continue
            coords = source_coordinates(
                self.coordinate_transformation_mode, out_len, in_len, scale, box
            )
            if crop:
                bad = (coords < 0) | (coords > in_len - 1)
                shape = [1] * rank
                shape[axis] = out_len
                bad = bad.reshape(shape)
                outside_mask = bad if outside_mask is None else outside_mask | bad
            if self.mode == "nearest":
                idx = nearest_index(coords, self.nearest_mode, in_len, scale)
                out = np.take(out, idx, axis=axis)
            else:
                w = interpolation_weights(
                    coords, in_len, self.mode, scale, self.cubic_coeff_a,
                    self.exclude_outside, self.antialias,
                )  # fmt: skip
                out = np.moveaxis(np.tensordot(w, out, axes=([1], [axis])), 0, axis)
        if outside_mask is not None:
            out = np.where(outside_mask, np.asarray(self.extrapolation_value, out.dtype), out)
        return _cast_like(out, x.dtype, output_shape.type())


def _cast_like(values: np.ndarray, dtype: np.dtype, type_name: str) -> np.ndarray:
    """Interpolated float64 values in `dtype`: integers are rounded and saturated."""
    if type_name in FLOAT_TYPES or dtype == np.bool_:
        return np.asarray(values.astype(dtype), order="C")
    info = np.iinfo(dtype)
    return np.asarray(np.clip(np.rint(values), info.min, info.max).astype(dtype), order="C")
