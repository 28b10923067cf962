"""`quantize_int8(..., residuals=True)` on the `ref` and `cpu` targets: the residual add reads
its operand quantised (one more quantise where that operand is no product's input already),
the `cpu` target computes the `ref` numbers, and the result stays as close to ONNX Runtime's
float output as the plain int8 program is."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import pygraphx

ort = pytest.importorskip("onnxruntime")


def _block_model():
    """Conv + bias + ReLU, then a bottleneck: 1x1 + ReLU, 3x3 + ReLU, 1x1, + the block input,
    ReLU; a second stage whose shortcut is a 1x1 stride-2 convolution."""
    rng = np.random.default_rng(11)

    def init(name, *shape, scale):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name
        )

    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"]),
        helper.make_node("Add", ["c3", "r0"], ["s"]),
        helper.make_node("Relu", ["s"], ["r3"]),
        helper.make_node("Conv", ["r3", "w4", "b4"], ["c4"], strides=[2, 2]),
        helper.make_node("Conv", ["r3", "w5", "b5"], ["c5"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Add", ["c5", "c4"], ["s2"]),
        helper.make_node("Relu", ["s2"], ["y"]),
    ]
    inits = [
        init("w0", 16, 3, 3, 3, scale=0.3), init("b0", 16, scale=0.1),
        init("w1", 8, 16, 1, 1, scale=0.3), init("b1", 8, scale=0.1),
        init("w2", 8, 8, 3, 3, scale=0.2), init("b2", 8, scale=0.1),
        init("w3", 16, 8, 1, 1, scale=0.3), init("b3", 16, scale=0.1),
        init("w4", 24, 16, 1, 1, scale=0.3), init("b4", 24, scale=0.1),
        init("w5", 24, 16, 3, 3, scale=0.1), init("b5", 24, scale=0.1),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "blocks",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((2, 3, 12, 12), np.float32)}


def _run(model, target: str, residuals: bool) -> tuple[np.ndarray, list[str]]:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_int8(prog, "ref", [_feeds(k) for k in range(1, 5)], residuals=residuals)
    names = [i.op.name for i in prog.get_main_module().instructions]
    prog.compile(pygraphx.get_target(target))
    return np.asarray(prog.run(_feeds(0))[0], np.float64), names


def test_residual_adds_are_quantised_and_cpu_computes_ref_numbers() -> None:
    model = _block_model()
    plain, plain_names = _run(model, "ref", False)
    want, names = _run(model, "ref", True)
    got, _ = _run(model, "cpu", True)
    # the block input is already quantised (the next block's inputs); the stride-2 stage's
    # earlier product output (c5 + bias) gets its own quantise
    assert names.count("quantizelinear") == plain_names.count("quantizelinear") + 1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref_float = sess.run(None, _feeds(0))[0].astype(np.float64)

    def rel(a):
        return float(np.linalg.norm(a - ref_float) / np.linalg.norm(ref_float))

    assert rel(want) < 0.05 and rel(plain) < 0.05, (rel(want), rel(plain))
    assert rel(want) < 2 * rel(plain) + 0.01  # one more rounding, not a different program
