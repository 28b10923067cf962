"""MobileNetV2 (torchvision layout, width 1.0) written as an ONNX graph with random weights.

Part of the project's built-in model zoo (``pygraphx.models``), used by the driver's
``--model mobilenetv2`` and by tests. The graph follows ``torch.onnx.export`` of
``torchvision.models.mobilenet_v2`` in eval mode with the batch norms kept: Conv -> BN ->
Clip(min=0, max=6) (ReLU6, with min/max given as Constant inputs), inverted residual blocks
(1x1 expand, 3x3 depthwise with group=C, 1x1 linear projection, Add when shapes match),
a final 1x1 conv to 1280 channels, GlobalAveragePool -> Flatten -> Gemm(transB=1).
Batch-norm running statistics are calibrated as described in ``resnet50``.
"""

from __future__ import annotations

import numpy as np
import onnx

from pygraphx.models._builder import GraphBuilder
from pygraphx.models.resnet50 import Feat, add, batchnorm, conv, input_feat

# (expand ratio t, output channels c, repeats n, first stride s), as in the paper.
SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
LAST_CHANNELS = 1280
NUM_CLASSES = 1000


def _conv_bn(gb: GraphBuilder, x: Feat, cout: int, k: int, stride: int = 1, group: int = 1) -> Feat:
    """Conv2dNormActivation: Conv (no bias) -> BatchNormalization -> Clip(0, 6)."""
    with gb.scope(0):
        x = conv(gb, x, cout, k, stride, group)
    with gb.scope(1):
        x = batchnorm(gb, x)
    with gb.scope(2):
        name = gb.op("Clip", x.name, gb.const(0.0, np.float32), gb.const(6.0, np.float32))
    return Feat(name, np.clip(x.val, 0.0, 6.0))


def _inverted_residual(gb: GraphBuilder, x: Feat, cout: int, stride: int, expand: int) -> Feat:
    cin = x.channels
    hidden = cin * expand
    use_res = stride == 1 and cin == cout
    h, idx = x, 0
    with gb.scope("conv"):
        if expand != 1:
            with gb.scope(idx):
                h = _conv_bn(gb, h, hidden, 1)
            idx += 1
        with gb.scope(idx):
            h = _conv_bn(gb, h, hidden, 3, stride, group=hidden)
        # Linear bottleneck: 1x1 projection conv then BN, no activation.
        with gb.scope(idx + 1):
            h = conv(gb, h, cout, 1)
        with gb.scope(idx + 2):
            h = batchnorm(gb, h, gamma=0.4 if use_res else 1.0)
    return add(gb, x, h) if use_res else h


def build_mobilenetv2(*, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """Build MobileNetV2 with input ``input`` [batch,3,224,224] and output ``output``."""
    gb = GraphBuilder(seed)
    x = input_feat(gb, batch)
    with gb.scope("features"):
        with gb.scope(0):
            x = _conv_bn(gb, x, 32, 3, 2)
        fi = 1
        for t, c, n, s in SETTINGS:
            for i in range(n):
                with gb.scope(fi):
                    x = _inverted_residual(gb, x, c, s if i == 0 else 1, t)
                fi += 1
        with gb.scope(fi):
            x = _conv_bn(gb, x, LAST_CHANNELS, 1)
    x = gb.op("Flatten", gb.op("GlobalAveragePool", x.name), axis=1)
    with gb.scope("classifier", 1):
        w = gb.initializer(gb.normal((NUM_CLASSES, LAST_CHANNELS), 0.01), "weight")
        b = gb.initializer(np.zeros(NUM_CLASSES, np.float32), "bias")
        gb.op("Gemm", x, w, b, output="output", alpha=1.0, beta=1.0, transB=1)
    gb.add_output("output", np.float32, [batch, NUM_CLASSES])
    return gb.build("mobilenetv2", "torchvision MobileNetV2 (width 1.0) layout, random weights")
