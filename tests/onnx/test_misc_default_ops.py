"""The remaining default-domain ops (GridSample, AffineGrid, Col2Im, CumProd, TensorScatter,
BitCast) against ONNX Runtime, or ONNX's reference evaluator where ONNX Runtime
has no kernel or disagrees with the specification (each such case says why).

ONNX's own node tests for them run in test_signal_detection_node_suite.py.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from pygraphx.onnx.errors import OnnxParseError
from pygraphx.ops.extra import col2im_blocks
from tests.helpers import check_node, make_model, run_pgx
from tests.onnx.reference_check import RNG, check_reference

# --- GridSample and AffineGrid ----------------------------------------------------------------
GS_X = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
GS_GRID = RNG.uniform(-1.3, 1.3, (2, 4, 7, 2)).astype(np.float32)
GS_GRID[0, 0, :, 0] = np.linspace(-1, 1, 7)  # exact ties for nearest
GS_X3 = RNG.standard_normal((2, 2, 3, 4, 5)).astype(np.float32)
GS_GRID3 = RNG.uniform(-1.3, 1.3, (2, 2, 3, 4, 3)).astype(np.float32)


@pytest.mark.parametrize(
    ("opset", "mode"),
    [
        (16, "bilinear"),
        (16, "nearest"),
        (16, "bicubic"),
        (20, "linear"),
        (20, "nearest"),
        (20, "cubic"),
    ],
)
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_2d(opset, mode, padding_mode, align_corners):
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    check_node("GridSample", {"X": GS_X, "G": GS_GRID}, attrs, opset=opset, rtol=1e-4, atol=1e-5)


# ONNX Runtime has cubic for 4-D inputs only: 5-D cubic is checked against ONNX's reference,
# except with border padding, where the reference clamps the coordinate (we follow ORT and
# PyTorch, as the 2-D test checks) and no peer implements 5-D cubic
GS3_CASES = [
    (mode, pad)
    for mode in ("linear", "nearest", "cubic")
    for pad in ("zeros", "border", "reflection")
    if (mode, pad) != ("cubic", "border")
]


@pytest.mark.parametrize(("mode", "padding_mode"), GS3_CASES)
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_3d(mode, padding_mode, align_corners):
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    feeds = {"X": GS_X3, "G": GS_GRID3}
    if mode != "cubic":
        check_node("GridSample", feeds, attrs, opset=22, rtol=1e-4, atol=1e-5)
        return
    model = make_model(
        [helper.make_node("GridSample", ["X", "G"], ["y"], **attrs)], feeds, ["y"], opset=22
    )
    check_reference(model, feeds, 1e-4, 1e-5)


@pytest.mark.parametrize(("nd", "align_corners"), [(2, 0), (2, 1), (3, 0), (3, 1)])
def test_affine_grid(nd, align_corners):
    theta = RNG.standard_normal((2, nd, nd + 1)).astype(np.float32)
    size = [2, 3, 5, 6] if nd == 2 else [2, 3, 4, 5, 6]
    inits = {"size": np.array(size, np.int64)}
    check_node(
        "AffineGrid",
        {"theta": theta},
        {"align_corners": align_corners},
        initializers=inits,
        opset=20,
    )


def test_affine_grid_runtime_size_without_declared_shape_is_an_error():
    feeds = {
        "theta": RNG.standard_normal((2, 2, 3)).astype(np.float32),
        "size": np.array([2, 3, 5, 6], np.int64),
    }
    model = make_model(
        [helper.make_node("AffineGrid", ["theta", "size"], ["y"])], feeds, ["y"], opset=20
    )
    with pytest.raises(OnnxParseError, match="must be known at compile time"):
        run_pgx(model, feeds, specialize_on_input_values=False)


# --- Col2Im, CumProd, TensorScatter, BitCast --------------------------------------------------
COL2IM_CASES = [
    ([5, 5], [2, 2], [1, 1], [0, 0, 0, 0], [1, 1]),
    ([6, 7], [3, 2], [2, 1], [1, 0, 2, 1], [2, 3]),
    ([4, 5, 6], [2, 1, 3], [1, 1, 1], [0] * 6, [1, 2, 1]),
    ([8], [3], [1], [1, 2], [2]),
]


@pytest.mark.parametrize(("image", "block", "dilations", "pads", "strides"), COL2IM_CASES)
def test_col2im(image, block, dilations, pads, strides):
    length = int(np.prod(col2im_blocks(image, block, dilations, pads, strides)))
    x = RNG.standard_normal((2, 3 * int(np.prod(block)), length)).astype(np.float32)
    attrs = {"dilations": dilations, "pads": pads, "strides": strides}
    inits = {"i": np.array(image, np.int64), "b": np.array(block, np.int64)}
    check_node("Col2Im", {"x": x}, attrs, initializers=inits, opset=18)


def test_col2im_1d_dilated_against_onnx_reference():
    # ONNX Runtime's 1-D Col2Im ignores the dilation; ONNX's reference and torch's fold agree
    x = RNG.standard_normal((1, 6, 4)).astype(np.float32)
    node = helper.make_node(
        "Col2Im", ["x", "i", "b"], ["y"], dilations=[2], pads=[1, 2], strides=[2]
    )
    inits = {"i": np.array([8], np.int64), "b": np.array([3], np.int64)}
    check_reference(make_model([node], {"x": x}, ["y"], inits, opset=18), {"x": x})


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_cumprod(dtype, axis, exclusive, reverse):
    x = RNG.integers(1, 4, (3, 4, 2)).astype(dtype)
    attrs = {"exclusive": exclusive, "reverse": reverse}
    check_node("CumProd", {"x": x}, attrs, initializers={"a": np.array(axis, np.int64)}, opset=26)


def test_cumprod_runtime_axis():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    check_node("CumProd", {"x": x, "a": np.array(1, np.int32)}, opset=26)


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 1])
def test_tensor_scatter(mode, axis):
    cache = RNG.standard_normal((3, 2, 6, 4)).astype(np.float32)
    update = RNG.standard_normal((3, 2, 3, 4)).astype(np.float32)
    if axis == 1:
        cache, update = cache[:, 0], update[:, 0]
    write = np.array([0, 3, 2] if mode == "linear" else [4, 5, 1], np.int64)
    feeds = {"c": cache, "u": update, "w": write}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_node("TensorScatter", feeds, {"mode": mode, "axis": axis}, opset=24)


def test_tensor_scatter_linear_overflow_is_an_error():
    feeds = {
        "c": np.zeros((1, 4, 2), np.float32),
        "u": np.ones((1, 2, 2), np.float32),
        "w": np.array([3], np.int64),
    }
    model = make_model(
        [helper.make_node("TensorScatter", ["c", "u", "w"], ["y"], axis=1)], feeds, ["y"], opset=24
    )
    with pytest.raises(Exception, match="writes positions 3..4"):
        run_pgx(model, feeds)


@pytest.mark.parametrize(
    ("src", "to"),
    [
        (np.float32, TensorProto.INT32),
        (np.int64, TensorProto.DOUBLE),
        (np.float16, TensorProto.INT16),
        (np.uint8, TensorProto.INT8),
        (np.uint64, TensorProto.INT64),
    ],
)
def test_bitcast(src, to):
    x = (RNG.standard_normal((2, 3)) * 100).astype(src)
    check_node("BitCast", {"x": x}, {"to": to}, opset=26)


def test_bitcast_bool_against_onnx_reference():
    # ONNX Runtime has no bool BitCast kernel
    x = np.array([True, False, True], bool)
    node = helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.UINT8)
    check_reference(make_model([node], {"x": x}, ["y"], opset=26), {"x": x})


def test_bitcast_to_bfloat16_and_width_mismatch():
    x = RNG.integers(-1000, 1000, (2, 3)).astype(np.int16)
    model = make_model(
        [helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.BFLOAT16)],
        {"x": x},
        ["y"],
        opset=26,
    )
    ours = run_pgx(model, {"x": x})[0]
    assert ours.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(ours.view(np.int16), x)  # bit for bit (NaNs included)
    model.graph.node[0].attribute[
        0
    ].i = TensorProto.INT32  # after shape inference, which rejects it
    with pytest.raises(OnnxParseError, match="differ in width"):
        run_pgx(model, {"x": x})
