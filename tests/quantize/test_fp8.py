"""quantize_fp8: the quantised program on `ref` against a numpy/ml_dtypes re-implementation of
fp8 e4m3 inference (scales max|x| / 448, weights per output channel), `cpu` against `ref`, the
float-maths warning, the default parameters' warning and the fp8 report.

Oracle: the calibration maxima are recomputed in float64 from the calibration inputs, values
are rounded to e4m3 by ml_dtypes (round to nearest even, saturating at 448) and dequantised in
float32 (element-wise, bit-exact); the products are computed in float64, so the program's
float32 sums are compared with a tolerance of float32 rounding, far below one fp8 step.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import pygraphx
from pygraphx.quantize import QuantizeError, quant_report, quantize_fp8
from tests.quantize.test_int8 import mlp

F32 = np.float32
E4M3 = ml_dtypes.float8_e4m3fn


def fp8_dq(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """x rounded to e4m3 at `scale` (saturating) and dequantised, in float32."""
    q = np.clip(x.astype(F32) / scale.astype(F32), -448, 448).astype(E4M3)
    return q.astype(F32) * scale.astype(F32)


def act_scale(values: list[np.ndarray]) -> np.ndarray:
    return np.float32([max(float(np.abs(v).max()) for v in values) / 448])


def weight_scales(w: np.ndarray, axis: int) -> np.ndarray:
    others = tuple(a for a in range(w.ndim) if a != axis)
    mags = np.abs(w).max(axis=others)
    return np.where(mags > 0, mags / F32(448), F32(1)).astype(F32)


def mlp_oracle(params, calib: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    w1, b1, w2 = params
    s1 = act_scale(calib)
    s2 = act_scale([np.maximum(c.astype(np.float64) @ w1 + b1, 0) for c in calib])
    qw1 = fp8_dq(w1, weight_scales(w1, 1)[None, :]).astype(np.float64)
    qw2 = fp8_dq(w2.T, weight_scales(w2.T, 1)[None, :]).astype(np.float64)
    h = np.maximum(fp8_dq(x, s1).astype(np.float64) @ qw1 + b1, 0)
    return fp8_dq(h.astype(F32), s2).astype(np.float64) @ qw2


def quantised_mlp(seed: int = 0, target: str = "ref"):
    rng = np.random.default_rng(seed)
    model, params = mlp(rng)
    calib = [rng.standard_normal((3, 8)).astype(F32) for _ in range(4)]
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    quantize_fp8(prog, target, [{"x": c} for c in calib])
    tests = [rng.standard_normal((3, 8)).astype(F32) for _ in range(3)]  # a few values saturate
    return prog, (lambda x: mlp_oracle(params, calib, x)), tests


def test_ref_matches_fp8_oracle():
    prog, oracle, tests = quantised_mlp()
    types = {ins.shape.type() for ins in prog.get_main_module().instructions}
    assert "fp8e4m3fn_type" in types
    ops = [ins.op.name for ins in prog.get_main_module().instructions]
    assert ops.count("quantizelinear") == 2 and ops.count("dequantizelinear") == 4
    prog.compile("ref")
    for x in tests:
        got = np.asarray(prog.run({"x": x})[0])
        want = oracle(x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_fp8_is_coarser_than_float_but_close():
    """The quantised outputs differ from float by about an fp8 step (not 0, not garbage)."""
    rng = np.random.default_rng(0)
    model, (w1, b1, w2) = mlp(rng)
    prog, _, tests = quantised_mlp()
    prog.compile("ref")
    for x in tests:
        got = np.asarray(prog.run({"x": x})[0])
        want = np.maximum(x.astype(np.float64) @ w1 + b1, 0) @ w2.T.astype(np.float64)
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert 1e-4 < rel < 0.3  # 3 mantissa bits (steps of 1/16 to 1/8), sums that cancel


def test_cpu_warns_float_maths_once_and_matches_ref():
    from pygraphx.quantize import fp8

    fp8._warned.discard("cpu")
    with pytest.warns(UserWarning, match="no fp8 GEMM kernel"):
        prog, oracle, tests = quantised_mlp(target="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: a second quantisation is quiet
        quantised_mlp(seed=1, target="cpu")
    prog.compile("cpu")
    for x in tests:
        got = np.asarray(prog.run({"x": x})[0])
        want = oracle(x)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_no_calibration_warns_default_scale():
    model, _ = mlp(np.random.default_rng(1))
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    with pytest.warns(UserWarning, match="quantize_fp8: no calibration data"):
        quantize_fp8(prog, "ref", None)
    scales = [
        ins.inputs[1].inputs[0].get_literal().array
        for ins in prog.get_main_module().instructions
        if ins.op.name == "quantizelinear"
    ]
    assert scales and all(np.array_equal(s, np.float32([1 / 64])) for s in scales)


def test_errors_name_fp8():
    model, _ = mlp(np.random.default_rng(3))
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    with pytest.raises(QuantizeError, match="quantize_fp8 quantises"):
        quantize_fp8(prog, "ref", None, ins_names=("add",))
    prog.compile("ref")
    with pytest.raises(QuantizeError, match=r"quantize_fp8\(prog"):
        quantize_fp8(prog, "ref", [])


def test_fp8_report_layers_and_lines():
    rng = np.random.default_rng(5)
    model, _ = mlp(rng)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    calib = [{"x": rng.standard_normal((3, 8)).astype(F32)} for _ in range(4)]
    tests = [{"x": rng.standard_normal((3, 8)).astype(F32)} for _ in range(4)]
    report = quant_report(prog, "ref", calib, tests, precision="fp8")
    assert report.precision == "fp8" and [layer.op for layer in report.layers] == ["dot"] * 2
    # e4m3 has 3 mantissa bits: about 25-35 dB per layer, far from float and from noise
    assert all(15.0 < layer.sqnr_db < 45.0 for layer in report.layers)
    text = report.lines(["y"])
    assert text[1].startswith("  y: relative RMS error ")
    sqnrs = [float(line.split()[0]) for line in text[3:]]
    assert sqnrs == sorted(sqnrs) and len(sqnrs) == 2
    assert not prog.is_compiled()
