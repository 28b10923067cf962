"""quantize_int8(dynamic=True): run-time per-row scales for the dots' activations.

An attention score block (q = x @ wq, k = x @ wk, scores = q @ k^T) against a numpy
re-implementation: x's rows are quantised with max|row| / 127 each, the weights per output
column; q's rows and k^T's columns (k's rows) are quantised with their own run-time scales;
the int64 sums are scaled by the float32 product of the two scales. Inputs and weights are
dyadic, so max |row| and every float step are computed exactly by both, and `ref` must equal
the oracle bit for bit; `cpu` runs the same maths as torch integer kernels.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

from pygraphx.quantize import quant_report, quantize_int8
from tests.helpers import make_model
from tests.quantize.test_int8 import F32, dyadic, parse, q8, run, weight_scales


def attention_scores(rng: np.random.Generator):
    wq, wk = dyadic(rng, (8, 6), 16, 16), dyadic(rng, (8, 6), 16, 16)
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["y"]),
    ]
    model = make_model(nodes, {"x": np.zeros((2, 5, 8), F32)}, ["y"], {"wq": wq, "wk": wk})
    return model, (wq, wk)


def row_scale(x: np.ndarray) -> np.ndarray:
    """max |row| / 127 in float32, one per row (kept as a length-1 last axis); an all-zero
    row's maximum is taken as 1e-30."""
    top = np.maximum(np.abs(x).max(axis=-1, keepdims=True), F32(1e-30))
    return top.astype(F32) / F32(127)


def dynamic_dot(a: np.ndarray, b: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """a (float, per-row run-time scales) @ b (int sums times the folded float32 scales)."""
    sa = row_scale(a)
    acc = q8(a, sa) @ b
    return acc.astype(F32) * (sa * sb)


def oracle(params, x: np.ndarray) -> np.ndarray:
    wq, wk = params
    swq, swk = weight_scales(wq, 1), weight_scales(wk, 1)
    q = dynamic_dot(x, q8(wq, swq[None, :]), swq[None, :])
    k = dynamic_dot(x, q8(wk, swk[None, :]), swk[None, :])
    sk = row_scale(k)  # k^T's columns are k's rows
    kt = np.swapaxes(q8(k, sk), -1, -2)
    return dynamic_dot(q, kt, np.swapaxes(sk, -1, -2))


def quantised(seed: int = 0):
    rng = np.random.default_rng(seed)
    model, params = attention_scores(rng)
    prog = parse(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no calibration is needed: no warning
        quantize_int8(prog, "ref", None, dynamic=True)
    x = dyadic(rng, (2, 5, 8), 8, 20)
    x[1, 2] = 0  # an all-zero row quantises to zeros
    return prog, params, x


def test_dynamic_ref_equals_numpy_oracle_exactly():
    prog, params, x = quantised()
    ops = [ins.op.name for ins in prog.get_main_module().instructions]
    assert ops.count("quant_dot") == 3 and "dot" not in ops
    prog.compile("ref")
    got = run(prog, {"x": x})
    np.testing.assert_array_equal(got, oracle(params, x))
    assert np.all(got[1, 2] == 0) and np.all(got[1, :, 2] == 0)


def test_dynamic_cpu_matches_ref_within_one_step():
    prog, params, x = quantised(1)
    prog.compile("cpu")
    assert prog._executable.fallbacks == {}  # every int8 step ran as torch integer kernels
    want = oracle(params, x)
    np.testing.assert_allclose(run(prog, {"x": x}), want, rtol=0, atol=np.abs(want).max() / 127)


def test_dynamic_is_closer_to_float_than_per_tensor_on_peaked_rows():
    """Rows of very different magnitudes (tokens): per-tensor scales, set by the large ones,
    give the ordinary rows a few int8 steps, per-row scales do not (measured on the second
    batch entry, whose rows are all ordinary)."""
    rng = np.random.default_rng(2)
    model, _ = attention_scores(rng)
    x = rng.standard_normal((2, 5, 8)).astype(F32)
    x[0, 0] *= 50
    calib = [{"x": x}]
    float_prog = parse(model)
    float_prog.compile("ref")
    want = run(float_prog, {"x": x})
    errors = []
    for dynamic in (False, True):
        prog = parse(model)
        quantize_int8(prog, "ref", calib, dynamic=dynamic)
        prog.compile("ref")
        errors.append(np.linalg.norm(run(prog, {"x": x})[1] - want[1]) / np.linalg.norm(want[1]))
    assert errors[1] < 0.02 < errors[0]


def test_dynamic_report_marks_every_dot_quantised():
    rng = np.random.default_rng(3)
    model, _ = attention_scores(rng)
    samples = [{"x": rng.standard_normal((2, 5, 8)).astype(F32)}]
    report = quant_report(parse(model), "ref", None, samples, dynamic=True)
    assert len(report.layers) == 3 and all(layer.quantized for layer in report.layers)
    assert all(layer.sqnr_db > 25 for layer in report.layers)


def test_dynamic_leaves_convolutions_calibrated():
    from tests.quantize.test_int8 import cnn

    model, _ = cnn(np.random.default_rng(4))
    with pytest.warns(UserWarning, match="no calibration data"):
        quantize_int8(parse(model), "ref", None, dynamic=True)
