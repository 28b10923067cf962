"""ResNet-50 (torchvision v1.5 layout) written as an ONNX graph with random weights.

Part of the project's built-in model zoo (``pygraphx.models``), used by the driver's
``--model resnet50`` and by tests. The graph mirrors what ``torch.onnx.export`` gives for
``torchvision.models.resnet50`` in eval mode *without* constant folding of the batch norms:
Conv (no bias) -> BatchNormalization -> Relu, MaxPool(k3 s2 p1), bottlenecks with the stride
on the 3x3 conv, residual Add, GlobalAveragePool -> Flatten -> Gemm(transB=1).
Folding the BatchNormalization nodes into the convs is left to the compiler's passes.

The conv/BN helpers here (shared with ``mobilenetv2``) also run every layer in numpy on a
small batch of standard-normal calibration images while the graph is written, and give each
BatchNormalization the measured per-channel mean/variance as running statistics (a
data-dependent init, like the statistics of a trained network). So every BN output channel
is about N(beta, gamma^2), activations stay O(1) over the whole depth, and the output
depends on the input image instead of on per-channel offsets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from pygraphx.models._builder import GraphBuilder

LAYERS = (3, 4, 6, 3)
WIDTHS = (64, 128, 256, 512)
EXPANSION = 4
NUM_CLASSES = 1000

CALIB_BATCH = 2


@dataclass
class Feat:
    """A feature map: its tensor name and its value on the calibration batch (NCHW)."""

    name: str
    val: np.ndarray

    @property
    def channels(self) -> int:
        return self.val.shape[1]


def _np_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int, group: int) -> np.ndarray:
    """Reference NCHW convolution (group 1 or depthwise) used for calibration."""
    n, c = x.shape[:2]
    cout, cin_g, k, _ = w.shape
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))
    win = win[:, :, ::stride, ::stride]  # (n, c, oh, ow, k, k)
    oh, ow = win.shape[2:4]
    if group == 1:
        cols = np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(-1, c * k * k)
        out = cols @ w.reshape(cout, -1).T
        return np.ascontiguousarray(out.reshape(n, oh, ow, cout).transpose(0, 3, 1, 2))
    if group == c == cout and cin_g == 1:
        return np.einsum("nchwkl,ckl->nchw", win, w[:, 0], optimize=True)
    raise NotImplementedError(f"calibration conv supports group 1 or depthwise, got {group}")


def conv(
    gb: GraphBuilder,
    x: Feat,
    cout: int,
    k: int,
    stride: int = 1,
    group: int = 1,
    pad: int | None = None,
) -> Feat:
    """Bias-free Conv with Kaiming-normal (fan_in) weights, in the current scope."""
    cin = x.channels
    pad = (k - 1) // 2 if pad is None else pad
    w = gb.normal((cout, cin // group, k, k), math.sqrt(2.0 / (cin // group * k * k)))
    name = gb.op(
        "Conv",
        x.name,
        gb.initializer(w, "weight"),
        dilations=[1, 1],
        group=group,
        kernel_shape=[k, k],
        pads=[pad] * 4,
        strides=[stride, stride],
    )
    return Feat(name, _np_conv(x.val, w, stride, pad, group))


def batchnorm(gb: GraphBuilder, x: Feat, gamma: float = 1.0) -> Feat:
    """Eval-mode BatchNormalization with running stats measured on the calibration batch."""
    c = x.channels
    scale = gb.normal((c,), 0.05 * gamma, gamma)
    bias = gb.normal((c,), 0.02)
    mean = x.val.mean(axis=(0, 2, 3))
    var = np.maximum(x.val.var(axis=(0, 2, 3)), 1e-3)
    name = gb.op(
        "BatchNormalization",
        x.name,
        gb.initializer(scale, "weight"),
        gb.initializer(bias, "bias"),
        gb.initializer(mean, "running_mean"),
        gb.initializer(var, "running_var"),
        epsilon=1e-5,
        momentum=0.9,
    )
    inv = scale / np.sqrt(var + np.float32(1e-5))
    val = (x.val - mean[:, None, None]) * inv[:, None, None] + bias[:, None, None]
    return Feat(name, val.astype(np.float32))


def relu(gb: GraphBuilder, x: Feat) -> Feat:
    """Relu node."""
    return Feat(gb.op("Relu", x.name), np.maximum(x.val, 0))


def add(gb: GraphBuilder, a: Feat, b: Feat) -> Feat:
    """Elementwise (residual) Add."""
    return Feat(gb.op("Add", a.name, b.name), a.val + b.val)


def input_feat(gb: GraphBuilder, batch: int, size: int = 224) -> Feat:
    """Graph input ``input`` [batch,3,size,size] with a standard-normal calibration batch."""
    name = gb.add_input("input", np.float32, [batch, 3, size, size])
    return Feat(name, gb.normal((CALIB_BATCH, 3, size, size), 1.0))


def _bottleneck(gb: GraphBuilder, x: Feat, width: int, stride: int) -> Feat:
    cout = width * EXPANSION
    with gb.scope("conv1"):
        h = conv(gb, x, width, 1)
    with gb.scope("bn1"):
        h = relu(gb, batchnorm(gb, h))
    with gb.scope("conv2"):
        h = conv(gb, h, width, 3, stride)
    with gb.scope("bn2"):
        h = relu(gb, batchnorm(gb, h))
    with gb.scope("conv3"):
        h = conv(gb, h, cout, 1)
    with gb.scope("bn3"):
        # A small last-BN gamma keeps the residual stream bounded over the 16 blocks.
        h = batchnorm(gb, h, gamma=0.3)
    if stride != 1 or x.channels != cout:
        with gb.scope("downsample"):
            with gb.scope(0):
                x = conv(gb, x, cout, 1, stride)
            with gb.scope(1):
                x = batchnorm(gb, x)
    return relu(gb, add(gb, h, x))


def build_resnet50(*, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """Build ResNet-50 with input ``input`` [batch,3,224,224] and output ``output``."""
    gb = GraphBuilder(seed)
    x = input_feat(gb, batch)
    with gb.scope("conv1"):
        x = conv(gb, x, 64, 7, 2, pad=3)
    with gb.scope("bn1"):
        x = relu(gb, batchnorm(gb, x))
    name = gb.op(
        "MaxPool",
        x.name,
        ceil_mode=0,
        dilations=[1, 1],
        kernel_shape=[3, 3],
        pads=[1, 1, 1, 1],
        strides=[2, 2],
    )
    xp = np.pad(x.val, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    x = Feat(name, win.max(axis=(4, 5)))
    for li, (blocks, width) in enumerate(zip(LAYERS, WIDTHS, strict=True)):
        for bi in range(blocks):
            with gb.scope(f"layer{li + 1}", bi):
                x = _bottleneck(gb, x, width, 2 if (li > 0 and bi == 0) else 1)
    pooled = gb.op("Flatten", gb.op("GlobalAveragePool", x.name), axis=1)
    cin = x.channels
    with gb.scope("fc"):
        bound = 1.0 / math.sqrt(cin)
        w = gb.rng.uniform(-bound, bound, (NUM_CLASSES, cin)).astype(np.float32)
        b = gb.rng.uniform(-bound, bound, (NUM_CLASSES,)).astype(np.float32)
        gb.op(
            "Gemm",
            pooled,
            gb.initializer(w, "weight"),
            gb.initializer(b, "bias"),
            output="output",
            alpha=1.0,
            beta=1.0,
            transB=1,
        )
    gb.add_output("output", np.float32, [batch, NUM_CLASSES])
    return gb.build("resnet50", "torchvision ResNet-50 v1.5 layout, random weights")
