"""quantize_int8: the quantised program on `ref` against a numpy re-implementation of the
quantised maths, `cpu` against `ref`, the no-calibration warning, the percentile statistic and
the accuracy report.

Oracle design: inputs and weights are dyadic (small multiples of powers of two), so every float
sum the calibration run makes is exact whatever the summation order; the numpy oracle then
computes the same calibration maxima independently, quantises with numpy (round half to even,
clip), accumulates in int64 and applies the scales with float32 element-wise operations, which
are bit-exact. Equality with the oracle is exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import pygraphx
from pygraphx.quantize import QuantizeError, int8_report, quantize_int8
from tests.helpers import make_model

F32 = np.float32


def dyadic(rng: np.random.Generator, shape: tuple[int, ...], denom: int, top: int) -> np.ndarray:
    return (rng.integers(-top, top + 1, size=shape) / denom).astype(F32)


def parse(model) -> pygraphx.Program:
    return pygraphx.parse_onnx_buffer(model.SerializeToString())


def run(prog: pygraphx.Program, feeds: dict) -> np.ndarray:
    return np.asarray(prog.run(feeds)[0])


# --- the numpy oracle -------------------------------------------------------------------------
def q8(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x.astype(F32) / scale.astype(F32)), -128, 127).astype(np.int64)


def act_scale(values: list[np.ndarray]) -> F32:
    """max |x| over the calibration values / 127 (computed in float64, rounded to float32)."""
    return F32(max(float(np.abs(v).max()) for v in values) / 127)


def weight_scales(w: np.ndarray, axis: int) -> np.ndarray:
    others = tuple(a for a in range(w.ndim) if a != axis)
    mags = np.abs(w).max(axis=others)
    return np.where(mags > 0, mags / F32(127), F32(1)).astype(F32)


def int_conv(x: np.ndarray, w: np.ndarray, pad: int, stride: int) -> np.ndarray:
    """Direct convolution in x's dtype (int64 for the integer sums), NCHW / OIHW."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, _, h, wd = x.shape
    m, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, m, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]
            out += np.einsum("nchw,mc->nmhw", patch, w[:, :, i, j])
    return out


def float_conv(x: np.ndarray, w: np.ndarray, pad: int, stride: int) -> np.ndarray:
    return int_conv(x.astype(np.float64), w.astype(np.float64), pad, stride)  # exact: dyadic


# --- models ---------------------------------------------------------------------------------
def mlp(rng: np.random.Generator):
    w1, b1 = dyadic(rng, (8, 16), 16, 16), dyadic(rng, (16,), 8, 4)
    w2 = dyadic(rng, (4, 16), 16, 16)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["h3"]),
        helper.make_node("Gemm", ["h3", "w2"], ["y"], transB=1),
    ]
    x = np.zeros((3, 8), F32)
    return make_model(nodes, {"x": x}, ["y"], {"w1": w1, "b1": b1, "w2": w2}), (w1, b1, w2)


def mlp_oracle(params, calib: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    w1, b1, w2 = params
    s1 = act_scale(calib)
    s2 = act_scale([np.maximum(c.astype(np.float64) @ w1 + b1, 0) for c in calib])
    sw1, sw2 = weight_scales(w1, 1), weight_scales(w2.T, 1)
    acc1 = q8(x, s1) @ q8(w1, sw1[None, :])
    h = (acc1.astype(F32) * (s1 * sw1)) + b1
    h = np.maximum(h, F32(0))
    acc2 = q8(h, s2) @ q8(w2.T, sw2[None, :])
    return acc2.astype(F32) * (s2 * sw2)


def cnn(rng: np.random.Generator):
    c1, c2 = dyadic(rng, (6, 3, 3, 3), 16, 16), dyadic(rng, (4, 6, 3, 3), 16, 16)
    nodes = [
        helper.make_node("Conv", ["x", "c1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["a2"]),
        helper.make_node("Conv", ["a2", "c2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2]),
    ]
    x = np.zeros((2, 3, 6, 6), F32)
    return make_model(nodes, {"x": x}, ["y"], {"c1": c1, "c2": c2}), (c1, c2)


def cnn_oracle(params, calib: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    c1, c2 = params
    s1 = act_scale(calib)
    s2 = act_scale([np.maximum(float_conv(c, c1, 1, 1), 0) for c in calib])
    sw1, sw2 = weight_scales(c1, 0), weight_scales(c2, 0)
    acc1 = int_conv(q8(x, s1), q8(c1, sw1[:, None, None, None]), 1, 1)
    a = np.maximum(acc1.astype(F32) * (s1 * sw1)[None, :, None, None], F32(0))
    acc2 = int_conv(q8(a, s2), q8(c2, sw2[:, None, None, None]), 1, 2)
    return acc2.astype(F32) * (s2 * sw2)[None, :, None, None]


CASES = {"mlp": (mlp, mlp_oracle, (3, 8)), "cnn": (cnn, cnn_oracle, (2, 3, 6, 6))}


def quantised(name: str, seed: int = 0):
    build, oracle, shape = CASES[name]
    rng = np.random.default_rng(seed)
    model, params = build(rng)
    calib = [dyadic(rng, shape, 8, 16) for _ in range(4)]
    prog = parse(model)
    quantize_int8(prog, pygraphx.get_target("ref"), [{"x": c} for c in calib])
    tests = [dyadic(rng, shape, 8, 20) for _ in range(3)]  # some beyond the calibrated range
    return model, prog, (lambda x: oracle(params, calib, x)), tests


# --- tests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_ref_equals_numpy_oracle_exactly(name):
    _, prog, oracle, tests = quantised(name)
    ops = [ins.op.name for ins in prog.get_main_module().instructions]
    assert "dot" not in ops and "convolution" not in ops
    assert {"quant_dot", "quant_convolution"} & set(ops)
    prog.compile("ref")
    for x in tests:
        got, want = run(prog, {"x": x}), oracle(x)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_matches_ref_within_one_step(name):
    model, prog, oracle, tests = quantised(name)
    prog.compile("cpu")
    assert prog._executable.fallbacks == {}  # every int8 step ran as torch integer kernels
    for x in tests:
        got, want = run(prog, {"x": x}), oracle(x)
        step = np.abs(want).max() / 127  # far coarser than the largest output step
        np.testing.assert_allclose(got, want, rtol=0, atol=step)


def test_no_calibration_warns_and_uses_default_scale():
    model, _ = mlp(np.random.default_rng(1))
    prog = parse(model)
    with pytest.warns(UserWarning, match="no calibration data"):
        quantize_int8(prog, "ref", [])
    scales = [
        ins.inputs[1].inputs[0].get_literal().array
        for ins in prog.get_main_module().instructions
        if ins.op.name == "quantizelinear"
    ]
    assert scales and all(np.array_equal(s, np.float32([1 / 64])) for s in scales)


def test_percentile_statistic_matches_numpy():
    rng = np.random.default_rng(2)
    model, _ = mlp(rng)
    calib = [rng.standard_normal((3, 8)).astype(F32) for _ in range(3)]
    prog = parse(model)
    quantize_int8(prog, "ref", [{"x": c} for c in calib], method="percentile", percentile=90.0)
    first = next(i for i in prog.get_main_module().instructions if i.op.name == "quantizelinear")
    scale = first.inputs[1].inputs[0].get_literal().array[0]
    want = np.percentile(np.abs(np.concatenate([c.ravel() for c in calib])), 90.0) / 127
    np.testing.assert_allclose(scale, want, rtol=1e-6)


def test_errors_name_the_problem():
    model, _ = mlp(np.random.default_rng(3))
    prog = parse(model)
    with pytest.raises(QuantizeError, match="cannot quantise"):
        quantize_int8(prog, "ref", None, ins_names=("add",))
    with pytest.raises(QuantizeError, match="unknown calibration method"):
        quantize_int8(prog, "ref", [{"x": np.zeros((3, 8), F32)}], method="entropy")
    prog.compile("ref")
    with pytest.raises(QuantizeError, match="already compiled"):
        quantize_int8(prog, "ref", [])


# --- accuracy report ------------------------------------------------------------------------
def resnetish(rng: np.random.Generator, batch: int = 8, classes: int = 10):
    """A stem, two residual blocks, global average pooling and a classifier (He-initialised)."""

    def he(shape):
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(F32)

    inits = {"stem": he((16, 3, 3, 3)), "fc": he((classes, 16)), "fcb": np.zeros(classes, F32)}
    nodes = [helper.make_node("Conv", ["x", "stem"], ["t0"], pads=[1] * 4, strides=[2, 2])]
    nodes.append(helper.make_node("Relu", ["t0"], ["r0"]))
    for b in range(2):
        inits[f"w{b}a"], inits[f"w{b}b"] = he((16, 16, 3, 3)), he((16, 16, 3, 3))
        nodes += [
            helper.make_node("Conv", [f"r{b}", f"w{b}a"], [f"c{b}a"], pads=[1] * 4),
            helper.make_node("Relu", [f"c{b}a"], [f"c{b}r"]),
            helper.make_node("Conv", [f"c{b}r", f"w{b}b"], [f"c{b}b"], pads=[1] * 4),
            helper.make_node("Add", [f"c{b}b", f"r{b}"], [f"s{b}"]),
            helper.make_node("Relu", [f"s{b}"], [f"r{b + 1}"]),
        ]
    nodes += [
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1),
    ]
    x = np.zeros((batch, 3, 16, 16), F32)
    return make_model(nodes, {"x": x}, ["y"], inits)


def test_report_resnetish_top1_and_sqnr():
    rng = np.random.default_rng(4)
    prog = parse(resnetish(rng))
    feeds = [{"x": rng.standard_normal((8, 3, 16, 16)).astype(F32)} for _ in range(8)]
    report = int8_report(prog, "cpu", feeds[:4], feeds[4:])
    print(
        "\nint8 resnet-ish:", report.outputs, [(w.name, round(w.sqnr_db, 1)) for w in report.layers]
    )
    assert [layer.op for layer in report.layers] == ["convolution"] * 5 + ["dot"]
    assert all(15.0 < layer.sqnr_db < 60.0 for layer in report.layers)  # int8-like, not float
    (out,) = report.outputs
    assert out.top1_agreement is not None and out.top1_agreement >= 0.9
    assert 0.0 < out.rel_rms < 0.1
    assert not prog.is_compiled()  # the report works on copies
    assert report.worst(1)[0].sqnr_db == min(layer.sqnr_db for layer in report.layers)


# --- the fold_qdq pass on its own -----------------------------------------------------------
def qdq_dot_program(
    zero_point: int, weight_zero_point: int = 0
) -> tuple[pygraphx.Program, np.ndarray, np.ndarray]:
    from pygraphx.ops.base import make_op

    rng = np.random.default_rng(5)
    w = rng.integers(-127, 128, size=(4, 3)).astype(np.int8)
    col = np.float32([0.25, 0.5, 0.125])
    prog = pygraphx.Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", pygraphx.Shape("int8_type", [2, 4]))
    sx = m.add_literal(np.full((2, 4), 0.5, F32))
    zx = m.add_literal(np.full((2, 4), zero_point, np.int8))
    a = m.add_instruction(make_op("dequantizelinear"), [x, sx, zx])
    zw = m.add_literal(np.full((4, 3), weight_zero_point, np.int8))
    b = m.add_instruction(
        make_op("dequantizelinear"), [m.add_literal(w), m.add_literal(np.tile(col, (4, 1))), zw]
    )
    m.add_return([m.add_instruction(make_op("dot"), [a, b])])
    return prog, w, col


@pytest.mark.parametrize("zp", [0, 3])
def test_fold_qdq_folds_activation_zero_points_exactly(zp):
    """(x - zp) @ w = x @ w - zp * column sums of w, in int32, times the folded scale."""
    from pygraphx.passes.fold_qdq import fold_qdq

    x = np.random.default_rng(6).integers(-128, 128, size=(2, 4)).astype(np.int8)
    for target in ("ref", "cpu"):
        compiled, w, col = qdq_dot_program(zp)
        fold_qdq(compiled.get_main_module())
        ops = [ins.op.name for ins in compiled.get_main_module().instructions]
        assert "quant_dot" in ops and "dot" not in ops and ("sub" in ops) == (zp != 0)
        compiled.compile(target)
        want_acc = (x.astype(np.int64) - zp) @ w.astype(np.int64)
        np.testing.assert_array_equal(
            run(compiled, {"x": x}), want_acc.astype(F32) * (F32(0.5) * col)
        )


def test_fold_qdq_keeps_weight_zero_points():
    from pygraphx.passes.fold_qdq import fold_qdq

    x = np.random.default_rng(6).integers(-128, 128, size=(2, 4)).astype(np.int8)
    prog, w, col = qdq_dot_program(0, weight_zero_point=2)
    fold_qdq(prog.get_main_module())
    ops = {ins.op.name for ins in prog.get_main_module().instructions}
    assert "dot" in ops and "quant_dot" not in ops
    prog.compile("ref")
    want = x.astype(np.int64) @ (w.astype(np.int64) - 2) * 0.5 * col
    np.testing.assert_allclose(run(prog, {"x": x}), want, rtol=1e-6)


# --- smoothing and keep_float ---------------------------------------------------------------
def test_smoothing_matches_numpy_oracle():
    """x @ w with a peaked input channel: smoothing divides x's channels by s = a^alpha /
    w^(1-alpha) (numpy here), scales w's rows by s, then quantises as usual."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((8, 5)).astype(F32)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        {"x": np.zeros((4, 8), F32)},
        ["y"],
        {"w": w},
    )
    calib = [
        rng.standard_normal((4, 8)).astype(F32) * np.float32([1, 1, 30, 1, 1, 1, 1, 1])
        for _ in range(3)
    ]
    prog = parse(model)
    quantize_int8(prog, "ref", [{"x": c} for c in calib], ins_names=("dot",), smooth=0.5)
    ops = [ins.op.name for ins in prog.get_main_module().instructions]
    assert "quant_dot" in ops and "mul" in ops
    prog.compile("ref")
    a = np.max([np.abs(c.astype(np.float64)).max(axis=0) for c in calib], axis=0)
    s = (np.sqrt(a) / np.sqrt(np.abs(w.astype(np.float64)).max(axis=1))).astype(F32)
    inv = (F32(1) / s).astype(F32)
    sx = F32(float(np.max(a / s)) / 127)
    ws = w * s[:, None]
    sw = weight_scales(ws, 1)
    x = rng.standard_normal((4, 8)).astype(F32) * np.float32([1, 1, 30, 1, 1, 1, 1, 1])
    want = (q8(x * inv, sx) @ q8(ws, sw[None, :])).astype(F32) * (sx * sw)
    np.testing.assert_allclose(run(prog, {"x": x}), want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    float_y = x.astype(np.float64) @ w
    plain = parse(model)
    quantize_int8(plain, "ref", [{"x": c} for c in calib], ins_names=("dot",))
    plain.compile("ref")
    err = lambda y: np.linalg.norm(y - float_y)  # noqa: E731
    assert err(run(prog, {"x": x})) < err(run(plain, {"x": x}))  # the outlier channel costs less


def test_keep_float_leaves_the_most_peaked_input_in_float():
    rng = np.random.default_rng(8)
    model, _ = mlp(rng)
    calib = [rng.standard_normal((3, 8)).astype(F32) for _ in range(3)]
    calib[0][0, 0] = 100.0  # x's crest factor is far above relu(h)'s
    prog = parse(model)
    quantize_int8(prog, "ref", [{"x": c} for c in calib], keep_float=1)
    ops = [ins.op.name for ins in prog.get_main_module().instructions]
    assert ops.count("dot") == 1 and ops.count("quant_dot") == 1
    first = next(
        i for i in prog.get_main_module().instructions if i.op.name in ("dot", "quant_dot")
    )
    assert first.op.name == "dot" and first.inputs[0].op.name == "@param"
