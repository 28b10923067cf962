"""CNN normalisations on NCHW tensors, and the spatial helpers the conv and pooling ops share.

Ops: `batch_norm_inference`, `instance_norm` and `lrn`, built by the ONNX handlers in
`onnx/handlers/normalization_nn.py` (a later pass may fold `batch_norm_inference` into the
convolution in front of it). Their numpy `compute()`s are the reference semantics; floating
point accumulates in float32 (float64 for double), as ONNX Runtime does; half, bf16 and fp8 are
computed in float32 and rounded once (`work_dtype`).

The helpers below serve the spatial operators of `conv.py` (convolution, deconvolution,
deform_convolution) and `pooling.py` (pooling, pooling_indices, max_unpool), which work on
`N x C x D1 x ... x Dn` inputs with any number (>= 1) of spatial dimensions. Spatial attributes
(`padding`, `stride`, `dilation`, `lengths`) have one value per spatial dimension; `padding` may
also have two (all begin values, then all end values), as in MIGraphX. The ONNX handlers
(`onnx/handlers/conv.py`, `pooling.py`) resolve `auto_pad` into explicit padding with
`same_padding`, so the IR always sees static numbers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from math import ceil

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pygraphx.ir.shape import FLOAT_TYPES, Shape
from pygraphx.ops.base import Op, ShapeError, check_arity, one_input, register_op


# --- shared helpers --------------------------------------------------------------------------
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


def _check_spatial(op: Op, nd: int, **attrs: Sequence[int]) -> None:
    for name, values in attrs.items():
        if len(values) != nd:
            raise ShapeError(
                f"{op.name}: {name} {list(values)} needs {nd} values for {nd} spatial dims"
            )
        if any(v < 1 for v in values):
            raise ShapeError(f"{op.name}: {name} {list(values)} must be positive")


def _check_input(op: Op, x: Shape, what: str = "input") -> int:
    if x.ndim() < 3:
        raise ShapeError(
            f"{op.name}: {what} must be N x C x spatial... (rank >= 3), got lens {x.lens()}"
        )
    if x.type() == "bool_type":
        raise ShapeError(f"{op.name}: {what} of bool_type is not supported")
    return x.ndim() - 2


def _windows(
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


def _taps(k: Sequence[int]) -> Iterator[tuple[int, ...]]:
    return itertools.product(*(range(kk) for kk in k))


def _pad(x: np.ndarray, begin: Sequence[int], end: Sequence[int], value: float) -> np.ndarray:
    """`x` padded on its spatial dims with `value` (no copy when there is no padding)."""
    if not any(begin) and not any(end):
        return x
    lens = [n + b + e for n, b, e in zip(x.shape[2:], begin, end, strict=True)]
    out = np.full((*x.shape[:2], *lens), value, dtype=x.dtype)
    inner = tuple(slice(b, b + n) for b, n in zip(begin, x.shape[2:], strict=True))
    out[(slice(None), slice(None), *inner)] = x
    return out


# --- normalisation ---------------------------------------------------------------------------
def _channel_params(op: Op, x: Shape, params: Sequence[Shape], lens: list[int]) -> None:
    for k, s in enumerate(params):
        if s.lens() != lens:
            raise ShapeError(
                f"{op.name}: parameter {k + 1} has lens {s.lens()}, expected {lens} for input "
                f"{x.lens()}"
            )
        if s.type() not in FLOAT_TYPES:
            raise ShapeError(f"{op.name}: parameter {k + 1} must be a float type, not {s.type()}")


def _per_channel(a: np.ndarray, nd: int, acc: np.dtype) -> np.ndarray:
    return a.astype(acc, copy=False).reshape(a.shape[0], *([1] * nd))


@register_op
class BatchNormInference(Op):
    """y = (x - mean) / sqrt(var + epsilon) * scale + bias, inputs (x, scale, bias, mean, var).

    `bn_mode` 1 (spatial): the parameters are per channel (C); 0 (per_activation): they have
    x's lens without the batch (C, D1, ..., Dn).
    """

    name = "batch_norm_inference"
    epsilon: float = 1e-5
    momentum: float = 0.9
    bn_mode: int = 1

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 5)
        x = inputs[0]
        if x.ndim() < 2 or x.type() not in FLOAT_TYPES:
            raise ShapeError(f"{self.name}: input must be a float N x C x ..., got {x}")
        if self.bn_mode not in (0, 1):
            raise ShapeError(f"{self.name}: bn_mode {self.bn_mode} must be 0 or 1")
        lens = x.lens()[1:2] if self.bn_mode == 1 else x.lens()[1:]
        _channel_params(self, x, inputs[1:], lens)
        return Shape(x.type(), x.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, scale, bias, mean, var = args
        acc = work_dtype(output_shape.type())
        if self.bn_mode == 1:
            scale, bias, mean, var = (_per_channel(a, x.ndim - 2, acc) for a in args[1:])
        else:
            scale, bias, mean, var = (a.astype(acc, copy=False) for a in args[1:])
        mul = scale / np.sqrt(var + acc.type(self.epsilon))
        y = x.astype(acc, copy=False) * mul
        y += bias - mean * mul
        return y.astype(output_shape.dtype(), copy=False)


@register_op
class InstanceNorm(Op):
    """y = (x - mean) / sqrt(var + epsilon) * scale[c] + bias[c], statistics per (n, c) image.

    Inputs (x, scale, bias) with x of N x C x D1... and scale, bias of (C).
    """

    name = "instance_norm"
    epsilon: float = 1e-5

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 3)
        x = inputs[0]
        if x.ndim() < 3 or x.type() not in FLOAT_TYPES:
            raise ShapeError(f"{self.name}: input must be a float N x C x D1..., got {x}")
        _channel_params(self, x, inputs[1:], x.lens()[1:2])
        return Shape(x.type(), x.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        acc = work_dtype(output_shape.type())
        x = args[0].astype(acc, copy=False)
        nd = x.ndim - 2
        scale, bias = (_per_channel(a, nd, acc) for a in args[1:])
        axes = tuple(range(2, x.ndim))
        mean = x.mean(axis=axes, keepdims=True, dtype=acc)
        centered = x - mean
        var = np.mean(centered * centered, axis=axes, keepdims=True, dtype=acc)
        y = centered * (scale / np.sqrt(var + acc.type(self.epsilon))) + bias
        return y.astype(output_shape.dtype(), copy=False)


@register_op
class Lrn(Op):
    """Local response normalisation across channels (ONNX LRN).

    y = x / (bias + alpha / size * sum(x[c']^2))^beta over the channels
    c - floor((size - 1) / 2) ... c + ceil((size - 1) / 2).
    """

    name = "lrn"
    alpha: float = 0.0001
    beta: float = 0.75
    bias: float = 1.0
    size: int = 1

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        x = one_input(self, inputs)
        if x.ndim() < 2 or x.type() not in FLOAT_TYPES:
            raise ShapeError(f"{self.name}: input must be a float N x C x ..., got {x}")
        if self.size < 1:
            raise ShapeError(f"{self.name}: size {self.size} must be positive")
        return Shape(x.type(), x.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        acc = work_dtype(output_shape.type())
        x = args[0].astype(acc, copy=False)
        c = x.shape[1]
        lo = (self.size - 1) // 2
        hi = self.size - 1 - lo
        # window sums over channels as differences of a zero-prefixed cumulative sum
        csum = np.zeros((x.shape[0], c + 1, *x.shape[2:]), dtype=acc)
        np.cumsum(x * x, axis=1, out=csum[:, 1:])
        top = np.minimum(np.arange(c) + hi + 1, c)
        bottom = np.maximum(np.arange(c) - lo, 0)
        square_sum = csum[:, top] - csum[:, bottom]
        denom = (acc.type(self.bias) + acc.type(self.alpha / self.size) * square_sum) ** acc.type(
            self.beta
        )
        return (x / denom).astype(output_shape.dtype(), copy=False)
