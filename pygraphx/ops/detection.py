"""Detection operators: `roialign`, and the data-dependent `nonmaxsuppression`, `nonzero` and
`unique`.

`roialign` (ONNX RoiAlign, MIGraphX's op of that name) pools each region of interest to
`output_height` x `output_width` bins, each the average (or maximum) of a grid of bilinear
samples, as ONNX's reference and ONNX Runtime compute it (including the max mode's maximum over
the four weighted corner values of each sample, and samples outside [-1, size] counting 0).

NonMaxSuppression, NonZero and Unique return as many rows as the data asks for. The IR has
static shapes, so these operators carry the number the model declares (`count`, from the
output's declared lens; the compute raises if the data disagrees) or, with `count=-1`, give the
largest possible shape from `compute_shape` while `compute` returns the real, smaller result:

- nonmaxsuppression: [count or batches * classes * min(max_boxes, boxes), 3]
- nonzero: [rank, count or elements]
- unique: [count or elements] (flattened) or the input's lens with `count` (or the input's
  length) on `axis`; indices and counts [count or that length]; inverse indices are static.

These operators set `data_dependent = True` (see `Op`): the shape is then an upper bound, and the
ref evaluator accepts any result within it (the torch-lowered targets do not yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from pygraphx.ir.shape import FLOAT_TYPES, Shape
from pygraphx.ops.base import OneInputOp, Op, ShapeError, check_arity, normalize_axis, register_op


def _check_count(op: Op, got: int, count: int, what: str) -> None:
    if count >= 0 and got != count:
        raise ValueError(
            f"{op.name}: the data gives {got} {what}, but the model declares {count} "
            "(the program was compiled for the declared shape)"
        )


# --- RoiAlign ---------------------------------------------------------------------------------
def _sample_axis(
    coords: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear terms along one axis for sample coordinates: (valid, low, high, w_low, w_high).

    A sample outside [-1, size] is invalid (it contributes 0); inside, it is clamped to
    [0, size - 1] and split between its two neighbouring pixels."""
    valid = (coords >= -1.0) & (coords <= size)
    v = np.maximum(coords, 0)
    low = np.floor(v).astype(np.int64)
    at_edge = low >= size - 1
    low = np.where(at_edge, size - 1, low)
    high = np.where(at_edge, size - 1, low + 1)
    v = np.where(at_edge, low.astype(v.dtype), v)
    w_high = (v - low).astype(v.dtype)
    w_low = (1 - w_high).astype(v.dtype)
    return valid, low, high, w_low, w_high


def roi_align(
    x: np.ndarray,
    rois: np.ndarray,
    batch_indices: np.ndarray,
    out_hw: tuple[int, int],
    sampling_ratio: int,
    spatial_scale: float,
    half_pixel: bool,
    mode: str,
) -> np.ndarray:
    """ONNX RoiAlign on [N, C, H, W] features and [R, 4] (x1, y1, x2, y2) regions."""
    dt = np.float64 if x.dtype == np.float64 else np.float32
    x = np.asarray(x, dtype=dt)
    channels, height, width = x.shape[1:]
    oh, ow = out_hw
    out = np.zeros((rois.shape[0], channels, oh, ow), dt)
    offset = dt(0.5 if half_pixel else 0.0)
    scale = dt(spatial_scale)
    for r, roi in enumerate(np.asarray(rois, dtype=dt)):
        feat = x[int(batch_indices[r])]
        start_w, start_h, end_w, end_h = (roi * scale - offset).astype(dt)
        roi_w, roi_h = end_w - start_w, end_h - start_h
        if not half_pixel:  # malformed regions become 1 x 1
            roi_w, roi_h = max(roi_w, dt(1)), max(roi_h, dt(1))
        bin_h, bin_w = roi_h / dt(oh), roi_w / dt(ow)
        grid_h = sampling_ratio if sampling_ratio > 0 else int(np.ceil(roi_h / dt(oh)))
        grid_w = sampling_ratio if sampling_ratio > 0 else int(np.ceil(roi_w / dt(ow)))
        # sample coordinates, [bins, samples per bin], in the order of ONNX's reference
        ys = start_h + np.arange(oh, dtype=dt)[:, None] * bin_h
        ys = ys + (np.arange(grid_h, dtype=dt)[None, :] + dt(0.5)) * bin_h / dt(grid_h)
        xs = start_w + np.arange(ow, dtype=dt)[:, None] * bin_w
        xs = xs + (np.arange(grid_w, dtype=dt)[None, :] + dt(0.5)) * bin_w / dt(grid_w)
        vy, y0, y1, hy, ly = _sample_axis(ys.astype(dt), height)
        vx, x0, x1, hx, lx = _sample_axis(xs.astype(dt), width)
        if mode == "avg":
            # bilinear weights are separable: out = Wy @ feat @ Wx^T / count
            wy = np.zeros((oh, height), dt)
            wx = np.zeros((ow, width), dt)
            for p in range(oh):
                np.add.at(wy[p], y0[p], np.where(vy[p], hy[p], 0))
                np.add.at(wy[p], y1[p], np.where(vy[p], ly[p], 0))
            for q in range(ow):
                np.add.at(wx[q], x0[q], np.where(vx[q], hx[q], 0))
                np.add.at(wx[q], x1[q], np.where(vx[q], lx[q], 0))
            count = max(grid_h * grid_w, 1)
            out[r] = np.einsum("ph,chw,qw->cpq", wy, feat, wx) / dt(count)
            continue
        # max: the largest weighted corner over every sample of the bin
        yy = (slice(None), slice(None), None, None)
        xx = (None, None, slice(None), slice(None))
        valid = vy[yy] & vx[xx]
        corners = [
            (hy[yy] * hx[xx], y0, x0),
            (hy[yy] * lx[xx], y0, x1),
            (ly[yy] * hx[xx], y1, x0),
            (ly[yy] * lx[xx], y1, x1),
        ]
        best = None
        for w, yi, xi in corners:
            v = np.where(valid, w, 0) * feat[:, yi[yy], xi[xx]]
            best = v if best is None else np.maximum(best, v)
        out[r] = best.max(axis=(2, 4)) if best.size else 0
    return out


@register_op
class Roialign(Op):
    """ONNX RoiAlign: inputs X [N, C, H, W], rois [R, 4], batch_indices [R] -> [R, C, oh, ow]."""

    name = "roialign"
    coordinate_transformation_mode: str = "half_pixel"
    mode: str = "avg"
    output_height: int = 1
    output_width: int = 1
    sampling_ratio: int = 0
    spatial_scale: float = 1.0

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 3)
        x, rois, idx = inputs
        if x.ndim() != 4 or x.type() not in FLOAT_TYPES:
            raise ShapeError(f"roialign: X must be a float [N, C, H, W] tensor, got {x}")
        if rois.ndim() != 2 or rois.lens()[1] != 4:
            raise ShapeError(f"roialign: rois must be [num_rois, 4], got {rois.lens()}")
        if idx.lens() != rois.lens()[:1] or idx.type() not in ("int32_type", "int64_type"):
            raise ShapeError(
                f"roialign: batch_indices must be integers of lens {rois.lens()[:1]}, got {idx}"
            )
        if self.mode not in ("avg", "max"):
            raise ShapeError(f"roialign: mode {self.mode!r} is not avg or max")
        if self.coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
            raise ShapeError(
                f"roialign: coordinate_transformation_mode {self.coordinate_transformation_mode!r}"
                " is not half_pixel or output_half_pixel"
            )
        lens = [rois.lens()[0], x.lens()[1], self.output_height, self.output_width]
        return Shape(x.type(), lens)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, rois, idx = args
        n = x.shape[0]
        if np.any((idx < 0) | (idx >= n)):
            raise IndexError(f"roialign: batch index outside [0, {n})")
        out = roi_align(
            x,
            rois,
            idx,
            (self.output_height, self.output_width),
            self.sampling_ratio,
            self.spatial_scale,
            self.coordinate_transformation_mode == "half_pixel",
            self.mode,
        )
        return out.astype(output_shape.dtype())


# --- NonMaxSuppression ------------------------------------------------------------------------
def _box_corners(boxes: np.ndarray, center_point_box: bool) -> np.ndarray:
    """[n, 4] boxes as (y_min, x_min, y_max, x_max), in the boxes' type."""
    b = np.asarray(boxes)
    if center_point_box:  # (x_center, y_center, width, height)
        half_w, half_h = b[:, 2] / 2, b[:, 3] / 2
        return np.stack([b[:, 1] - half_h, b[:, 0] - half_w, b[:, 1] + half_h, b[:, 0] + half_w], 1)
    y = np.sort(b[:, [0, 2]], axis=1)
    x = np.sort(b[:, [1, 3]], axis=1)
    return np.stack([y[:, 0], x[:, 0], y[:, 1], x[:, 1]], 1)


def _suppressed(corners: np.ndarray, box: int, kept: list[int], threshold: np.ndarray) -> bool:
    """True when box overlaps a kept box with IoU > threshold (ONNX's degenerate-box rules)."""
    if not kept:
        return False
    a, b = corners[box], corners[kept]
    iy0, ix0 = np.maximum(a[0], b[:, 0]), np.maximum(a[1], b[:, 1])
    iy1, ix1 = np.minimum(a[2], b[:, 2]), np.minimum(a[3], b[:, 3])
    overlap = (ix1 > ix0) & (iy1 > iy0)
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_a = (a[3] - a[1]) * (a[2] - a[0])
    area_b = (b[:, 3] - b[:, 1]) * (b[:, 2] - b[:, 0])
    union = area_a + area_b - inter
    ok = overlap & (inter > 0) & (area_a > 0) & (area_b > 0) & (union > 0)
    with np.errstate(all="ignore"):
        iou = inter / np.where(ok, union, 1)
    return bool(np.any(ok & (iou > threshold)))


def non_max_suppression(
    boxes: np.ndarray,
    scores: np.ndarray,
    max_boxes: int,
    iou_threshold: float,
    score_threshold: float | None,
    center_point_box: bool,
) -> np.ndarray:
    """ONNX NonMaxSuppression: [selected, 3] rows of (batch, class, box), int64."""
    rows: list[tuple[int, int, int]] = []
    dt = boxes.dtype
    threshold = np.asarray(iou_threshold, dtype=dt)
    for b in range(scores.shape[0]):
        corners = _box_corners(boxes[b], center_point_box)
        for c in range(scores.shape[1]):
            s = scores[b, c]
            candidates = np.arange(s.shape[0])
            if score_threshold is not None:
                candidates = candidates[s > np.asarray(score_threshold, dtype=s.dtype)]
            # highest score first; equal scores keep the lower box index first
            order = candidates[np.argsort(-s[candidates], kind="stable")]
            kept: list[int] = []
            for box in order:
                if len(kept) >= max_boxes:
                    break
                if not _suppressed(corners, int(box), kept, threshold):
                    kept.append(int(box))
            rows += [(b, c, k) for k in kept]
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


@register_op
class Nonmaxsuppression(Op):
    """ONNX NonMaxSuppression. Inputs: boxes [B, n, 4], scores [B, C, n] and, optionally,
    max_output_boxes_per_class, iou_threshold, score_threshold (scalars, read at run time).

    `max_boxes` is max_output_boxes_per_class when known at compile time (-1 when not), for the
    bound; `count` is the declared number of selected boxes (-1: unknown, see the module)."""

    name = "nonmaxsuppression"
    center_point_box: bool = False
    max_boxes: int = -1
    count: int = -1
    data_dependent: ClassVar[bool] = True

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2, 3, 4, 5)
        boxes, scores = inputs[:2]
        bl, sl = boxes.lens(), scores.lens()
        if len(bl) != 3 or bl[2] != 4 or len(sl) != 3 or sl[0] != bl[0] or sl[2] != bl[1]:
            raise ShapeError(
                f"nonmaxsuppression: boxes {bl} and scores {sl} must be [B, n, 4] and [B, C, n]"
            )
        if self.count >= 0:
            return Shape("int64_type", [self.count, 3])
        per_class = bl[1] if self.max_boxes < 0 else min(self.max_boxes, bl[1])
        return Shape("int64_type", [sl[0] * sl[1] * per_class, 3])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        def scalar(k: int) -> np.ndarray | None:
            if len(args) <= k or np.asarray(args[k]).size == 0:
                return None
            return np.asarray(args[k]).reshape(-1)[0]

        max_boxes = scalar(2)
        iou = scalar(3)
        out = non_max_suppression(
            np.asarray(args[0]),
            np.asarray(args[1]),
            0 if max_boxes is None else max(int(max_boxes), 0),
            0.0 if iou is None else iou,
            scalar(4),
            self.center_point_box,
        )
        _check_count(self, out.shape[0], self.count, "selected boxes")
        return out


# --- NonZero ----------------------------------------------------------------------------------
def nonzero(x: np.ndarray) -> np.ndarray:
    """ONNX NonZero: [rank, count] int64 indices in row-major order (a scalar as rank 1)."""
    out = np.array(np.nonzero(x.reshape(-1) if x.ndim == 0 else x), dtype=np.int64)
    return out.reshape(max(x.ndim, 1), -1)


@register_op
class Nonzero(OneInputOp):
    """The indices of the non-zero elements, [rank, count] int64, in row-major order (a scalar
    counts as rank 1, as ONNX Runtime has it)."""

    name = "nonzero"
    count: int = -1
    data_dependent: ClassVar[bool] = True

    def shape_for(self, s: Shape) -> Shape:
        n = self.count if self.count >= 0 else s.elements()
        return Shape("int64_type", [max(s.ndim(), 1), n])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        out = nonzero(np.asarray(args[0]))
        _check_count(self, out.shape[1], self.count, "non-zero elements")
        return out


# --- Unique -----------------------------------------------------------------------------------
def unique(
    x: np.ndarray, axis: int | None, sort: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ONNX Unique: (values, first indices, inverse indices, counts), sorted by value or, with
    `sort` false, in order of first occurrence."""
    flat = x.reshape(-1) if axis is None else x
    values, first, inverse, counts = np.unique(
        flat, return_index=True, return_inverse=True, return_counts=True, axis=axis
    )
    inverse = inverse.reshape(-1)
    if not sort:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[inverse]
        values = np.take(flat, first, axis=0 if axis is None else axis)
    as64 = lambda a: np.asarray(a, dtype=np.int64)  # noqa: E731
    return values, as64(first), as64(inverse), as64(counts)


@register_op
class Unique(OneInputOp):
    """ONNX Unique; `output` picks one of (Y, indices, inverse_indices, counts), as `topk`'s
    `output` does. `axis=None` flattens the input; `count` is the declared number of unique
    values (slices along `axis`), -1 when unknown (see the module)."""

    name = "unique"
    axis: int | None = None
    sorted: bool = True
    output: int = 0
    count: int = -1
    data_dependent: ClassVar[bool] = True

    def shape_for(self, s: Shape) -> Shape:
        if self.output not in (0, 1, 2, 3):
            raise ShapeError(f"unique: output must be 0..3, got {self.output}")
        lens = s.lens()
        if self.axis is None:
            length = s.elements()
        else:
            axis = normalize_axis(self, self.axis, s.ndim())
            length = lens[axis]
        n = self.count if self.count >= 0 else length
        if self.output == 2:
            return Shape("int64_type", [length])
        if self.output in (1, 3):
            return Shape("int64_type", [n])
        if self.axis is None:
            return Shape(s.type(), [n])
        lens[axis] = n
        return Shape(s.type(), lens)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = np.asarray(args[0])
        axis = None if self.axis is None else normalize_axis(self, self.axis, x.ndim)
        results = unique(x, axis, self.sorted)
        _check_count(self, results[1].shape[0], self.count, "unique values")
        return np.asarray(results[self.output], order="C")
