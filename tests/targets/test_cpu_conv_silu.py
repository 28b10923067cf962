"""Conv + bias + SiLU (YOLO's Conv-BN-SiLU, exported as Sigmoid and Mul) runs on `cpu` as one
step: the `silu` the passes recognise is oneDNN's swish post-op of the convolution (and an
in-place `F.silu` on the `torch_cl` kernel), on every kernel a layer can take. Checked against
ONNX Runtime; a SiLU after a residual add (torch's oneDNN binary entry point chains only relu
after it) and an add after a SiLU must run apart and still be right."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_conv  # noqa: E402
from tests.helpers import make_model, run_ort  # noqa: E402

RNG = np.random.default_rng(11)


def f32(*shape: int, scale: float = 0.3) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _net():
    """3x3 conv + SiLU, 1x1 conv + SiLU, 3x3 stride-2 conv + SiLU, then a 1x1 conv whose SiLU
    output is added to its input (C2f's shortcut) and a last SiLU after an add."""
    inits = {
        "w0": f32(16, 3, 3, 3), "b0": f32(16),
        "w1": f32(16, 16, 1, 1), "b1": f32(16),
        "w2": f32(32, 16, 3, 3), "b2": f32(32),
        "w3": f32(32, 32, 1, 1), "b3": f32(32),
    }  # fmt: skip
    node = helper.make_node

    def silu(x: str, y: str) -> list:
        return [node("Sigmoid", [x], [f"{y}_s"]), node("Mul", [x, f"{y}_s"], [y])]

    nodes = [
        node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        *silu("c0", "a0"),
        node("Conv", ["a0", "w1", "b1"], ["c1"]),
        *silu("c1", "a1"),
        node("Conv", ["a1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        *silu("c2", "a2"),
        node("Conv", ["a2", "w3", "b3"], ["c3"]),
        *silu("c3", "a3"),
        node("Add", ["a3", "a2"], ["s3"]),
        node("Conv", ["s3", "w3", "b3"], ["c4"]),
        node("Add", ["c4", "s3"], ["s4"]),
        *silu("s4", "y"),
    ]
    feeds = {"x": f32(1, 3, 20, 20, scale=1.0)}
    return make_model(nodes, feeds, ["y"], inits), feeds


DNNL = pytest.param(
    "dnnl", marks=pytest.mark.skipif(not onednn_conv.available(), reason="onednn-cpu-gomp missing")
)


@pytest.mark.parametrize("kernel", ["onednn", "matmul", DNNL, "torch_cl"])
def test_conv_silu_is_one_step_and_matches_ort(kernel: str) -> None:
    model, feeds = _net()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(conv_kernel=kernel))
    steps = [[i.op.name for i in s.instructions] for s in prog._executable.lowered.steps]
    fused = [names for names in steps if names[0] == "convolution" and len(names) > 1]
    # the three conv + bias + silu layers fold; silu(conv) + a2 (a post-op after the
    # activation) and silu(conv + s3) (an activation after a binary add) fold only on oneDNN's
    # own post-op chain (`dnnl`, whatever kernel is forced: no other fuses them), else run apart
    assert len(fused) == (5 if onednn_conv.available() else 3), steps
    np.testing.assert_allclose(prog.run(feeds)[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)
