"""Signal ops (DFT, STFT, windows, MelWeightMatrix) against ONNX Runtime, or ONNX's reference
evaluator where ONNX Runtime has no kernel or disagrees with the specification (each such case
says why).

ONNX's own node tests for them run in test_signal_detection_node_suite.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from pygraphx.onnx.errors import OnnxParseError
from tests.helpers import assert_outputs_match, check_node, make_model, run_pgx
from tests.onnx.reference_check import RNG, check_reference

# --- DFT --------------------------------------------------------------------------------------
X_REAL = RNG.standard_normal((2, 8, 5, 1)).astype(np.float32)
X_COMPLEX = RNG.standard_normal((2, 8, 5, 2)).astype(np.float32)
DFT_CASES = [
    # (input, inverse, onesided)
    (X_REAL, 0, 0),
    (X_REAL, 0, 1),
    (X_REAL, 1, 0),
    (X_COMPLEX, 0, 0),
    (X_COMPLEX, 1, 0),
    (X_COMPLEX, 1, 1),
]


def _dft_model(x, inverse, onesided, axis, length, opset):
    attrs = {"inverse": inverse, "onesided": onesided}
    inits = {}
    if opset < 20:
        attrs["axis"] = axis
        names = ["x"] + (["L"] if length else [])
    else:
        names = ["x", "L" if length else "", "a"]
        inits["a"] = np.array(axis, np.int64)
    if length:
        inits["L"] = np.array(length, np.int64)
    node = helper.make_node("DFT", names, ["y"], **attrs)
    return make_model([node], {"x": x}, ["y"], inits, opset=opset)


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("axis", [1, 2, -2, -3])
@pytest.mark.parametrize("length", [None, 6, 11])
@pytest.mark.parametrize(("x", "inverse", "onesided"), DFT_CASES, ids=lambda v: None)
def test_dft(x, inverse, onesided, length, axis, opset):
    model = _dft_model(x, inverse, onesided, axis, length, opset)
    feeds = {"x": x}
    in_bins = x.shape[axis]
    if inverse and onesided and length and in_bins != length // 2 + 1:
        # ONNX Runtime's inverse real DFT disagrees with numpy's irfft (which ONNX's reference
        # uses) when the one-sided input has more or fewer than dft_length // 2 + 1 bins
        check_reference(model, feeds, 1e-4, 1e-4)
        return
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_outputs_match(run_pgx(model, feeds), sess.run(None, feeds), 1e-4, 1e-4)


def test_dft_double_and_runtime_axis():
    x = RNG.standard_normal((3, 6, 2)).astype(np.float64)
    check_node("DFT", {"x": x}, {"inverse": 1}, initializers={"L": np.array(6, np.int64)}, opset=17)
    model = make_model(
        [helper.make_node("DFT", ["x", "", "axis"], ["y"])],
        {"x": X_COMPLEX, "axis": np.array(2, np.int64)},
        ["y"],
        opset=20,
    )
    model.graph.output[0].type.tensor_type.shape.Clear()
    for n in (2, 8, 5, 2):
        model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = n
    feeds = {"x": X_COMPLEX, "axis": np.array(2, np.int64)}
    check_reference(model, feeds, 1e-4, 1e-4)
    with pytest.raises(Exception, match="run-time axis 3"):
        run_pgx(model, {"x": X_COMPLEX, "axis": np.array(3, np.int64)})


def test_dft_errors():
    # (shape inference rejects a one-sided complex DFT too: the attribute is added after it)
    bad = make_model(
        [helper.make_node("DFT", ["x"], ["y"], axis=1)], {"x": X_COMPLEX}, ["y"], opset=17
    )
    bad.graph.node[0].attribute.append(helper.make_attribute("onesided", 1))
    with pytest.raises(OnnxParseError, match="one-sided forward DFT needs a real input"):
        run_pgx(bad, {"x": X_COMPLEX})
    bad = make_model(
        [helper.make_node("DFT", ["x"], ["y"], axis=1)], {"x": X_REAL}, ["y"], opset=17
    )
    bad.graph.node[0].attribute[0].i = 3
    with pytest.raises(OnnxParseError, match="not a signal axis"):
        run_pgx(bad, {"x": X_REAL})


# --- STFT -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("step", "length"), [(8, 16), (5, 16), (16, 16), (3, 7), (64, 64)])
@pytest.mark.parametrize(("channels", "onesided"), [(1, 1), (1, 0), (2, 0)])
@pytest.mark.parametrize("window", [True, False])
def test_stft(step, length, channels, onesided, window):
    signal = RNG.standard_normal((2, 64, channels)).astype(np.float32)
    inits = {"step": np.array(step, np.int64)}
    if window:
        inits["w"] = np.hanning(length).astype(np.float32)
        names = ["signal", "step", "w"]
    else:
        inits["fl"] = np.array(length, np.int64)
        names = ["signal", "step", "", "fl"]
    node = helper.make_node("STFT", names, ["y"], onesided=onesided)
    model = make_model([node], {"signal": signal}, ["y"], inits, opset=17)
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"signal": signal}
    assert_outputs_match(run_pgx(model, feeds), sess.run(None, feeds), 1e-4, 1e-4)


def test_stft_runtime_step_is_solved_from_the_declared_shape_and_checked():
    signal = RNG.standard_normal((1, 128, 1)).astype(np.float32)
    window = np.hanning(16).astype(np.float32)
    feeds = {"signal": signal, "step": np.array(8, np.int64), "w": window}
    model = make_model(
        [helper.make_node("STFT", ["signal", "step", "w"], ["y"])], feeds, ["y"], opset=17
    )
    model.graph.output[0].type.tensor_type.shape.Clear()
    for n in (1, 15, 9, 2):
        model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = n
    check_reference(model, feeds, 1e-4, 1e-4)
    with pytest.raises(Exception, match="compiled for"):
        run_pgx(model, {**feeds, "step": np.array(7, np.int64)})


# --- windows and MelWeightMatrix --------------------------------------------------------------
@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size", [1, 2, 5, 10, 64])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16])
def test_window(op, periodic, size, dtype):
    attrs = {"periodic": periodic, "output_datatype": dtype}
    atol = 1e-3 if dtype == TensorProto.FLOAT16 else 1e-6
    inits = {"n": np.array(size, np.int64)}
    check_node(op, {}, attrs, initializers=inits, opset=17, rtol=1e-5, atol=atol)


def test_window_runtime_size_is_checked():
    model = make_model(
        [helper.make_node("HannWindow", ["n"], ["y"])],
        {"n": np.array(10, np.int64)},
        ["y"],
        opset=17,
    )
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 10
    np.testing.assert_allclose(
        run_pgx(model, {"n": np.array(10, np.int64)})[0], np.hanning(11)[:10], atol=1e-6
    )
    with pytest.raises(Exception, match="compiled for"):
        run_pgx(model, {"n": np.array(9, np.int64)})


MEL_CASES = [(8, 16, 8192, 0.0, 4096.0), (10, 64, 16000, 20.0, 8000.0), (40, 512, 16000, 0, 8000)]


@pytest.mark.parametrize("args", MEL_CASES)
@pytest.mark.parametrize("runtime", [False, True])
def test_mel_weight_matrix(args, runtime):
    types = [np.int64, np.int64, np.int64, np.float32, np.float32]
    values = {k: np.array(v, t) for k, v, t in zip("abcde", args, types, strict=True)}
    if not runtime:
        check_node("MelWeightMatrix", {}, initializers=values, opset=17)
        return
    model = make_model(
        [helper.make_node("MelWeightMatrix", list("abcde"), ["y"])], values, ["y"], opset=17
    )
    model.graph.output[0].type.tensor_type.shape.Clear()
    for n in (args[1] // 2 + 1, args[0]):
        model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = n
    check_reference(model, values)


def test_mel_weight_matrix_out_of_range_is_an_error():
    # the upper edge (90 Hz) lies past the Nyquist frequency of a 100 Hz sample rate
    values = [
        np.array(v, t)
        for v, t in zip((3, 9, 100, 10, 90), [np.int64] * 3 + [np.float32] * 2, strict=True)
    ]
    model = make_model(
        [helper.make_node("MelWeightMatrix", list("abcde"), ["y"])],
        {},
        ["y"],
        dict(zip("abcde", values, strict=True)),
        opset=17,
    )
    with pytest.raises(OnnxParseError, match="outside the 5 bins"):
        run_pgx(model, {})
