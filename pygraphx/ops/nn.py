"""CNN normalisations on NCHW tensors.

Ops: `batch_norm_inference`, `instance_norm` and `lrn`, built by the ONNX handlers in
`onnx/handlers/normalization_nn.py` (a later pass may fold `batch_norm_inference` into the
convolution in front of it). Their numpy `compute()`s are the reference semantics; floating
point accumulates in float32 (float64 for double), as ONNX Runtime does; half, bf16 and fp8 are
computed in float32 and rounded once (`work_dtype`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pygraphx.ir.shape import FLOAT_TYPES, Shape
from pygraphx.ops.base import Op, ShapeError, check_arity, one_input, register_op
from pygraphx.ops.spatial import work_dtype


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
