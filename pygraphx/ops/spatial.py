"""The spatial helpers the conv and pooling operators share.

`conv.py` (convolution, deconvolution, deform_convolution) and `pooling.py` (pooling,
pooling_indices, max_unpool) work on `N x C x D1 x ... x Dn` inputs with any number (>= 1) of
spatial dimensions. Spatial attributes (`padding`, `stride`, `dilation`, `lengths`) have one
value per spatial dimension; `padding` may also have two (all begin values, then all end
values), as in MIGraphX. The ONNX handlers (`onnx/handlers/conv.py`, `pooling.py`) resolve
`auto_pad` into explicit padding with `same_padding`, so the IR always sees static numbers.
Values compute in `work_dtype` (float32 for half, bf16 and fp8; float64 for double).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from math import ceil

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pygraphx.ir.shape import FLOAT_TYPES, Shape
from pygraphx.ops.base import Op, ShapeError


def work_dtype(type_name: str) -> np.dtype:
    """The dtype a result of `type_name` is accumulated in (float32 for reduced floats)."""
    if type_name == "double_type":
        return np.dtype(np.float64)
    if type_name in FLOAT_TYPES:
        return np.dtype(np.float32)
    return np.dtype(np.int64)


def dilated(k: int, d: int) -> int:
    """Extent of a kernel of `k` taps spaced `d` apart."""
    return (k - 1) * d + 1


def split_padding(op: Op, padding: Sequence[int], nd: int) -> tuple[list[int], list[int]]:
    """(begin, end) padding lists from `nd` symmetric values or `2 * nd` begin+end values."""
    if len(padding) == nd:
        return list(padding), list(padding)
    if len(padding) == 2 * nd:
        return list(padding[:nd]), list(padding[nd:])
    raise ShapeError(
        f"{op.name}: padding {list(padding)} needs {nd} or {2 * nd} values for {nd} spatial dims"
    )


def same_padding(
    lens: Sequence[int], spans: Sequence[int], stride: Sequence[int], lower: bool
) -> tuple[list[int], list[int]]:
    """SAME padding: output = ceil(in / stride); the odd element goes last (upper) or first."""
    begin, end = [], []
    for n, span, s in zip(lens, spans, stride, strict=True):
        total = max((ceil(n / s) - 1) * s + span - n, 0)
        small = total // 2
        begin.append(total - small if lower else small)
        end.append(small if lower else total - small)
    return begin, end


def check_spatial(op: Op, nd: int, **attrs: Sequence[int]) -> None:
    for name, values in attrs.items():
        if len(values) != nd:
            raise ShapeError(
                f"{op.name}: {name} {list(values)} needs {nd} values for {nd} spatial dims"
            )
        if any(v < 1 for v in values):
            raise ShapeError(f"{op.name}: {name} {list(values)} must be positive")


def check_input(op: Op, x: Shape, what: str = "input") -> int:
    if x.ndim() < 3:
        raise ShapeError(
            f"{op.name}: {what} must be N x C x spatial... (rank >= 3), got lens {x.lens()}"
        )
    if x.type() == "bool_type":
        raise ShapeError(f"{op.name}: {what} of bool_type is not supported")
    return x.ndim() - 2


def windows(
    xp: np.ndarray,
    k: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    out: Sequence[int],
) -> np.ndarray:
    """Strided view (N, C, *out, *k) of every kernel placement on the padded input `xp`."""
    nd = len(k)
    spans = [dilated(kk, d) for kk, d in zip(k, dilation, strict=True)]
    win = sliding_window_view(xp, spans, axis=tuple(range(2, 2 + nd)))
    place = tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out, stride, strict=True))
    taps = tuple(slice(None, None, d) for d in dilation)
    return win[(slice(None), slice(None), *place, *taps)]


def taps(k: Sequence[int]) -> Iterator[tuple[int, ...]]:
    return itertools.product(*(range(kk) for kk in k))


def pad(x: np.ndarray, begin: Sequence[int], end: Sequence[int], value: float) -> np.ndarray:
    """`x` padded on its spatial dims with `value` (no copy when there is no padding)."""
    if not any(begin) and not any(end):
        return x
    lens = [n + b + e for n, b, e in zip(x.shape[2:], begin, end, strict=True)]
    out = np.full((*x.shape[:2], *lens), value, dtype=x.dtype)
    inner = tuple(slice(b, b + n) for b, n in zip(begin, x.shape[2:], strict=True))
    out[(slice(None), slice(None), *inner)] = x
    return out
