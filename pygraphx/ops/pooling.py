"""Pooling operators on NCHW tensors: `pooling`, `pooling_indices` and `max_unpool`.

`pooling` is average / max / lpnorm pooling over spatial windows (or over whole channels with
`global`), `pooling_indices` is where max pooling found each maximum (ONNX MaxPool's `Indices`)
and `max_unpool` scatters values back to those indices (ONNX MaxUnpool). `_PoolGeometry` holds
the output-size rules (padding, dilations, ceil_mode) that `pooling` and `pooling_indices`
share. They work on `N x C x D1 x ... x Dn` inputs with any number (>= 1) of spatial
dimensions, using the spatial helpers of `spatial.py`.

In the pipeline: the ONNX handlers (`onnx/handlers/pooling.py`) build these ops with `auto_pad`
already resolved into explicit padding; targets lower them
(`targets/torch_lowering/lower_nn.py`) or fall back to the numpy `compute()`s here, the
reference semantics, which reduce tap by tap over strided window views. Averages and Lp norms
accumulate in float32 (float64 for double); max pooling works in the input type.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np

from pygraphx.ir.shape import FLOAT_TYPES, Shape
from pygraphx.ops import spatial
from pygraphx.ops.base import Op, ShapeError, check_arity, one_input, register_op

POOLING_MODES = ("average", "max", "lpnorm")


# --- pooling ---------------------------------------------------------------------------------
class _PoolGeometry(Op):
    """Output size rules shared by `pooling` and `pooling_indices` (ONNX / PyTorch rules)."""

    padding: tuple[int, ...]
    stride: tuple[int, ...]
    lengths: tuple[int, ...]
    dilations: tuple[int, ...]
    ceil_mode: bool

    def geometry(self, lens: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        """(begin padding, end padding, output spatial lens) for input lens `lens`."""
        padding, stride, lengths = self.padding, self.stride, self.lengths
        dilations, ceil_mode = self.dilations, self.ceil_mode
        nd = len(lens) - 2
        spatial.check_spatial(self, nd, stride=stride, lengths=lengths, dilations=dilations)
        begin, end = spatial.split_padding(self, padding, nd)
        if any(p < 0 for p in begin + end):
            raise ShapeError(f"{self.name}: padding {list(padding)} must not be negative")
        out = []
        for n, b, e, s, k, d in zip(lens[2:], begin, end, stride, lengths, dilations, strict=True):
            span = n + b + e - spatial.dilated(k, d)
            if span < 0:
                raise ShapeError(
                    f"{self.name}: window {list(lengths)} (dilations {list(dilations)}) is "
                    f"larger than the padded input {list(lens[2:])}"
                )
            o = -(-span // s) + 1 if ceil_mode else span // s + 1
            if ceil_mode and (o - 1) * s >= n + b:
                o -= 1  # the last window would start in the end padding: dropped
            out.append(o)
        return begin, end, out

    def padded_windows(
        self, x: np.ndarray, fill: float, begin: list[int], end: list[int], out: list[int]
    ) -> np.ndarray:
        """Window view (N, C, *out, *k) of `x` padded with `fill`, incl. ceil_mode's overhang."""
        stride, lengths, dilations = self.stride, self.lengths, self.dilations
        ends = [
            max(e, (o - 1) * s + spatial.dilated(k, d) - n - b)
            for n, b, e, o, s, k, d in zip(
                x.shape[2:], begin, end, out, stride, lengths, dilations, strict=True
            )
        ]
        return spatial.windows(spatial.pad(x, begin, ends, fill), lengths, stride, dilations, out)


@register_op
class Pooling(_PoolGeometry):
    """Average, max or Lp-norm pooling over spatial windows of (N, C, *in).

    Padding never wins a max and adds nothing to a sum; an average divides by the number of
    input elements in the window, or with `count_include_pad` by the elements inside the padded
    input (not the ceil_mode overhang). `global` pools each whole channel to one value.
    """

    name = "pooling"
    mode: str = "average"
    padding: tuple[int, ...] = (0, 0)
    stride: tuple[int, ...] = (1, 1)
    lengths: tuple[int, ...] = (1, 1)
    ceil_mode: bool = False
    lp_order: int = 2
    global_: bool = False
    dilations: tuple[int, ...] = (1, 1)
    count_include_pad: bool = False

    def attributes(self) -> dict[str, object]:
        attrs = super().attributes()
        return {("global" if k == "global_" else k): v for k, v in attrs.items()}

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        x = one_input(self, inputs)
        nd = spatial.check_input(self, x)
        if self.mode not in POOLING_MODES:
            raise ShapeError(f"{self.name}: mode {self.mode!r} is not one of {POOLING_MODES}")
        if self.mode != "max" and x.type() not in FLOAT_TYPES:
            raise ShapeError(
                f"{self.name}: {self.mode} pooling needs a float input, not {x.type()}"
            )
        if self.mode == "lpnorm" and self.lp_order < 1:
            raise ShapeError(f"{self.name}: lp_order {self.lp_order} must be positive")
        if self.global_:
            return Shape(x.type(), [*x.lens()[:2], *([1] * nd)])
        _, _, out = self.geometry(x.lens())
        return Shape(x.type(), [*x.lens()[:2], *out])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        nd = x.ndim - 2
        axes = tuple(range(2, 2 + nd))
        acc = x.dtype if self.mode == "max" else spatial.work_dtype(output_shape.type())
        x = x.astype(acc, copy=False)
        if self.global_ or (
            list(self.lengths) == list(x.shape[2:])
            and not any(self.padding)
            and output_shape.lens()[2:] == [1] * nd
        ):
            y = self._reduce_all(x, axes)
        else:
            y = self._pool(x, output_shape.lens()[2:])
        return y.astype(output_shape.dtype(), copy=False)

    def _reduce_all(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        if self.mode == "max":
            return x.max(axis=axes, keepdims=True)
        if self.mode == "average":
            return x.mean(axis=axes, keepdims=True, dtype=x.dtype)
        p = self.lp_order
        s = np.sum(np.abs(x) ** p, axis=axes, keepdims=True, dtype=x.dtype)
        return np.sqrt(s) if p == 2 else s ** (1.0 / p)

    def _pool(self, x: np.ndarray, out: list[int]) -> np.ndarray:
        begin, end, _ = self.geometry(x.shape)
        if self.mode == "max":
            fill = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
            win = self.padded_windows(x, fill, begin, end, out)
            y = win[(..., *([0] * len(out)))].copy()
            for tap in spatial.taps(self.lengths):
                np.maximum(y, win[(..., *tap)], out=y)
            return y
        src = np.abs(x) ** self.lp_order if self.mode == "lpnorm" else x
        win = self.padded_windows(src, 0, begin, end, out)
        y = np.zeros(win.shape[: 2 + len(out)], dtype=x.dtype)
        for tap in spatial.taps(self.lengths):
            y += win[(..., *tap)]
        if self.mode == "lpnorm":
            return np.sqrt(y) if self.lp_order == 2 else y ** (1.0 / self.lp_order)
        # divisor per output position: window taps inside the input (or the padded input)
        mask = np.zeros(
            (1, 1, *(n + b + e for n, b, e in zip(x.shape[2:], begin, end, strict=True))), x.dtype
        )
        inner = tuple(slice(b, b + n) for b, n in zip(begin, x.shape[2:], strict=True))
        mask[(0, 0, *inner) if not self.count_include_pad else (0, 0)] = 1
        mwin = self.padded_windows(mask, 0, [0] * len(out), [0] * len(out), out)
        count = np.zeros(mwin.shape[: 2 + len(out)], dtype=x.dtype)
        for tap in spatial.taps(self.lengths):
            count += mwin[(..., *tap)]
        return y / np.maximum(count, 1)


@register_op
class PoolingIndices(_PoolGeometry):
    """Where max pooling found each maximum: flat int64 indices into the input (ONNX MaxPool's
    `Indices`), row-major, or with `storage_order=1` column-major within each (n, c) image.
    """

    name = "pooling_indices"
    padding: tuple[int, ...] = (0, 0)
    stride: tuple[int, ...] = (1, 1)
    lengths: tuple[int, ...] = (1, 1)
    ceil_mode: bool = False
    dilations: tuple[int, ...] = (1, 1)
    storage_order: int = 0

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        x = one_input(self, inputs)
        spatial.check_input(self, x)
        if self.storage_order not in (0, 1):
            raise ShapeError(f"{self.name}: storage_order {self.storage_order} must be 0 or 1")
        _, _, out = self.geometry(x.lens())
        return Shape("int64_type", [*x.lens()[:2], *out])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        n, c, *size = x.shape
        begin, end, out = self.geometry(x.shape)
        fill = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
        win = self.padded_windows(x, fill, begin, end, out)
        # flat index of every padded position (row- or column-major in the image), -1 in pads
        if self.storage_order:
            steps = [prod(size[:i]) for i in range(len(size))]
        else:
            steps = [prod(size[i + 1 :]) for i in range(len(size))]
        grids = np.meshgrid(*(np.arange(v, dtype=np.int64) for v in size), indexing="ij")
        flat = sum((g * st for g, st in zip(grids, steps, strict=True)), np.int64(0))
        iwin = self.padded_windows(flat[None, None], -1, begin, end, out)
        best = win[(..., *([0] * len(out)))].copy()
        idx = np.broadcast_to(iwin[(..., *([0] * len(out)))], best.shape).copy()
        for tap in spatial.taps(self.lengths):
            v = win[(..., *tap)]
            better = v > best
            best = np.where(better, v, best)
            idx = np.where(better, iwin[(..., *tap)], idx)
        base = (np.arange(n * c, dtype=np.int64) * prod(size)).reshape(n, c, *([1] * len(out)))
        return idx + base


@register_op
class MaxUnpool(Op):
    """Inverse of max pooling (ONNX MaxUnpool): zeros of `out_lens` with every input value
    written at its flat index from `pooling_indices`. Inputs (x, indices) of equal lens.
    """

    name = "max_unpool"
    out_lens: tuple[int, ...] = ()

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2)
        x, idx = inputs
        spatial.check_input(self, x)
        if idx.lens() != x.lens() or idx.type() not in ("int64_type", "int32_type"):
            raise ShapeError(f"{self.name}: indices {idx} must be integers of the input's lens")
        if len(self.out_lens) != x.ndim() or list(self.out_lens[:2]) != x.lens()[:2]:
            raise ShapeError(
                f"{self.name}: out_lens {list(self.out_lens)} must keep the input's N, C "
                f"{x.lens()[:2]}"
            )
        return Shape(x.type(), self.out_lens)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, idx = args
        y = np.zeros(output_shape.elements(), dtype=output_shape.dtype())
        flat = idx.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= y.size):
            raise ValueError(
                f"{self.name}: index {int(flat.max()) if flat.max() >= y.size else int(flat.min())}"
                f" is outside the output of {y.size} elements {list(self.out_lens)}"
            )
        y[flat] = x.reshape(-1)
        return y.reshape(self.out_lens)
