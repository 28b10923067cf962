"""fold_batch_norms (run by quantize_int8 before quantising): a convolution followed by an
inference batch norm becomes one convolution with scaled weights and a bias add; checked against
ONNX Runtime's float run of the original model, and the int8 program against it too."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import helper

from pygraphx.quantize import quantize_int8
from pygraphx.quantize.batch_norm import fold_batch_norms
from tests.helpers import make_model
from tests.quantize.test_int8 import F32, parse, run


def conv_bn_relu(rng: np.random.Generator):
    inits = {
        "w": rng.standard_normal((6, 3, 3, 3)).astype(F32) * 0.3,
        "g": rng.uniform(0.5, 2.0, 6).astype(F32),
        "b": rng.standard_normal(6).astype(F32),
        "m": rng.standard_normal(6).astype(F32),
        "v": rng.uniform(0.5, 2.0, 6).astype(F32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], epsilon=1e-3),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    return make_model(nodes, {"x": np.zeros((2, 3, 8, 8), F32)}, ["y"], inits)


def ort_run(model, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_fold_matches_onnxruntime_and_removes_the_batch_norm():
    rng = np.random.default_rng(0)
    model = conv_bn_relu(rng)
    prog = parse(model)
    assert fold_batch_norms(prog.get_main_module()) == 1
    ops = [i.op.name for i in prog.get_main_module().instructions]
    assert "batch_norm_inference" not in ops and ops.count("convolution") == 1
    prog.compile("ref")
    x = rng.standard_normal((2, 3, 8, 8)).astype(F32)
    np.testing.assert_allclose(run(prog, {"x": x}), ort_run(model, x), rtol=1e-5, atol=1e-5)


def test_int8_of_a_folded_batch_norm_is_close_to_float_on_cpu():
    rng = np.random.default_rng(1)
    model = conv_bn_relu(rng)
    calib = [{"x": rng.standard_normal((2, 3, 8, 8)).astype(F32)} for _ in range(4)]
    prog = parse(model)
    quantize_int8(prog, "cpu", calib)
    ops = [i.op.name for i in prog.get_main_module().instructions]
    assert "batch_norm_inference" not in ops and "quant_convolution" in ops
    prog.compile("cpu")
    assert prog._executable.fallbacks == {}
    x = rng.standard_normal((2, 3, 8, 8)).astype(F32)
    want = ort_run(model, x)
    assert np.linalg.norm(run(prog, {"x": x}) - want) / np.linalg.norm(want) < 0.02
