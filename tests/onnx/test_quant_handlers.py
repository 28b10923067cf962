"""QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear against ONNX Runtime.

Covers the opset versions that differ (10, 13 axis, 19 fp8 and saturate, 21 blocked and
output_dtype, 23 precision and DequantizeLinear's output_dtype), per-tensor, per-axis and blocked
layouts, every integer and fp8 target, round-half-to-even, saturation, NaN and infinities. fp8
results are compared through a Cast to float in the graph (ORT's Python API hands fp8 back as
raw bytes, or not at all).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from pygraphx.onnx.errors import OnnxParseError
from pygraphx.ops.quant import dequantize, quantize
from tests.helpers import check_node, make_model, run_ort, run_pgx

RNG = np.random.default_rng(0)
# ties at .5 (round half to even), out-of-range values, NaN, infinities and -0
EDGES = np.array(
    [0, 0.5, 1.5, 2.5, -0.5, -2.5, 3.49, 127.5, 128.5, 300, -300, 1e10, -1e10, -0.0],
    np.float32,
)
SPECIAL = np.array([np.nan, np.inf, -np.inf], np.float32)
INT_ZP = {
    "uint8": np.uint8(128),
    "int8": np.int8(-3),
    "uint16": np.uint16(30000),
    "int16": np.int16(-700),
}
FP8 = [
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e5m2fnuz,
]


# --- QuantizeLinear ---------------------------------------------------------------------------
def _type_opsets(opsets: list[int]) -> list[tuple[str, int]]:
    """(zero point type, opset) pairs: 16-bit types arrive in opset 21."""
    return [(t, v) for t in INT_ZP for v in opsets if v >= 21 or not t.endswith("16")]


@pytest.mark.parametrize(("zp_type", "opset"), _type_opsets([10, 13, 19, 21, 23]))
def test_quantize_integer_per_tensor(zp_type, opset):
    x = np.concatenate([EDGES, SPECIAL, RNG.standard_normal(50).astype(np.float32) * 100])
    inits = {"s": np.array(0.5, np.float32), "z": INT_ZP[zp_type]}
    check_node("QuantizeLinear", {"x": x}, initializers=inits, opset=opset)


@pytest.mark.parametrize("opset", [10, 13, 21])
def test_quantize_without_zero_point_is_uint8(opset):
    check_node("QuantizeLinear", {"x": EDGES, "s": np.array(0.25, np.float32)}, opset=opset)


def test_quantize_runtime_scale_and_zero_point():
    x = RNG.standard_normal((3, 5)).astype(np.float32) * 10
    feeds = {"x": x, "s": np.array(0.3, np.float32), "z": np.array(7, np.int8)}
    check_node("QuantizeLinear", feeds, opset=13)


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
def test_quantize_per_axis(axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32) * 20
    n = x.shape[axis]
    inits = {
        "s": RNG.uniform(0.1, 1, n).astype(np.float32),
        "z": RNG.integers(-20, 20, n).astype(np.int8),
    }
    check_node("QuantizeLinear", {"x": x}, {"axis": axis}, initializers=inits, opset=13)


@pytest.mark.parametrize(
    ("shape", "axis", "block", "blocks"),
    [((3, 8), 1, 4, 2), ((3, 7), 1, 3, 3), ((6, 5), 0, 2, 3), ((2, 5, 4), -2, 2, 3)],
    ids=["even", "short_last_block", "axis0", "negative_axis"],
)
@pytest.mark.parametrize("zero_point", [True, False])
def test_quantize_blocked(shape, axis, block, blocks, zero_point):
    x = RNG.standard_normal(shape).astype(np.float32) * 10
    pshape = list(shape)
    pshape[axis] = blocks
    inits = {"s": RNG.uniform(0.05, 1, pshape).astype(np.float32)}
    attrs = {"axis": axis, "block_size": block}
    if zero_point:
        inits["z"] = RNG.integers(0, 255, pshape).astype(np.uint8)
    else:
        attrs["output_dtype"] = onnx.TensorProto.INT8
    check_node("QuantizeLinear", {"x": x}, attrs, initializers=inits, opset=21)


@pytest.mark.parametrize("opset", [19, 21])
def test_quantize_float16(opset):
    x = (RNG.standard_normal(2000) * 50).astype(np.float16)
    inits = {"s": np.array(0.37, np.float16), "z": np.uint8(100)}
    check_node("QuantizeLinear", {"x": x}, initializers=inits, opset=opset)


def test_quantize_and_dequantize_bfloat16_against_onnx_reference():
    # ONNX Runtime's CPU kernels have no bfloat16 (De)QuantizeLinear: ONNX's reference is the peer
    x = (RNG.standard_normal(500) * 50).astype(ml_dtypes.bfloat16)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    inits = {"s": np.array(0.5, ml_dtypes.bfloat16), "z": np.int8(3)}
    model = make_model(nodes, {"x": x}, ["q", "y"], inits, opset=21)
    ref = ReferenceEvaluator(model).run(None, {"x": x})
    ours = run_pgx(model, {"x": x})
    np.testing.assert_array_equal(ours[0], ref[0])
    assert ours[1].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(ours[1].astype(np.float32), ref[1].astype(np.float32))


def test_quantize_precision_float16_rounds_the_quotient():
    # 1.25 / 0.5 = 2.5 exactly: a tie; 2049 / 1 rounds to 2048 in float16 before quantising
    x = np.array([1.25, 2049.0, 3.0], np.float32)
    model = make_model(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], precision=10)],
        {"x": x},
        ["y"],
        {"s": np.array([0.5, 1.0, 0.5], np.float32), "z": np.zeros(3, np.uint16)},
        opset=23,
    )
    model.graph.node[0].attribute.append(helper.make_attribute("axis", 0))
    ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(run_pgx(model, {"x": x})[0], ref)
    np.testing.assert_array_equal(ref, [2, 2048, 6])


def test_quantize_precision_float32():
    x = (RNG.standard_normal(500) * 50).astype(np.float16)
    model = make_model(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], precision=1)],
        {"x": x},
        ["y"],
        {"s": np.array(0.37, np.float16), "z": np.uint8(100)},
        opset=23,
    )
    ours = run_pgx(model, {"x": x})[0]
    ref = quantize(x.astype(np.float32), np.float32(np.float16(0.37)), np.uint8(100), np.uint8)
    np.testing.assert_array_equal(ours, ref)


def _fp8_model(dtype, saturate: int, x: np.ndarray, opset: int = 21) -> onnx.ModelProto:
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], saturate=saturate),
        helper.make_node("Cast", ["q"], ["y"], to=onnx.TensorProto.FLOAT),
    ]
    inits = {"s": np.array(1.0, np.float32), "z": np.zeros((), dtype)}
    return make_model(nodes, {"x": x}, ["y"], inits, opset=opset)


def _same_floats(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a), np.signbit(b))


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("dtype", FP8, ids=lambda d: d.__name__)
def test_quantize_fp8(dtype, saturate):
    x = np.array(
        [0, 1.5, 2.5, -2.5, 300, -300, 447, 449, 464, 465, 500, 1e6, 1e-9, 57344, 70000, 240,
         248, 250, 1e-3, 2e-3, -0.0, np.nan, np.inf, -np.inf],
        np.float32,
    )  # fmt: skip
    x = np.concatenate([x, RNG.standard_normal(100).astype(np.float32) * 100])
    model = _fp8_model(dtype, saturate, x)
    ours, ref = run_pgx(model, {"x": x})[0], run_ort(model, {"x": x})[0]
    assert _same_floats(ours, ref), np.stack([x, ours, ref])


def test_quantize_fp8_e5m2_rounding_overflow_follows_onnx():
    # 61440 lies half-way between e5m2's largest finite value (57344) and 65536; rounding to
    # nearest even goes up, past the largest finite value. ONNX's reference (ml_dtypes) gives
    # inf, which we follow; ONNX Runtime gives NaN for this rounding overflow.
    x = np.array([61440, -61440, 60000], np.float32)
    ours = run_pgx(_fp8_model(ml_dtypes.float8_e5m2, 0, x), {"x": x})[0]
    np.testing.assert_array_equal(ours, [np.inf, -np.inf, 57344])
    ours = run_pgx(_fp8_model(ml_dtypes.float8_e5m2, 1, x), {"x": x})[0]
    np.testing.assert_array_equal(ours, [57344, -57344, 57344])


def test_quantize_fp8_per_axis_scale():
    x = RNG.standard_normal((3, 4)).astype(np.float32) * 1000
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=0),
        helper.make_node("Cast", ["q"], ["y"], to=onnx.TensorProto.FLOAT),
    ]
    inits = {
        "s": np.array([0.5, 1, 2], np.float32),
        "z": np.zeros(3, ml_dtypes.float8_e4m3fn),
    }
    model = make_model(nodes, {"x": x}, ["y"], inits, opset=21)
    assert _same_floats(run_pgx(model, {"x": x})[0], run_ort(model, {"x": x})[0])


# --- DequantizeLinear -------------------------------------------------------------------------
@pytest.mark.parametrize(("zp_type", "opset"), _type_opsets([10, 13, 21]))
def test_dequantize_integer(zp_type, opset):
    zp = INT_ZP[zp_type]
    info = np.iinfo(zp.dtype)
    x = RNG.integers(info.min, info.max, 64, endpoint=True).astype(zp.dtype)
    x[:2] = [info.min, info.max]
    check_node(
        "DequantizeLinear", {"x": x}, initializers={"s": np.float32(0.37), "z": zp}, opset=opset
    )


def test_dequantize_int32_without_zero_point():
    x = RNG.integers(-(2**20), 2**20, 40).astype(np.int32)
    check_node("DequantizeLinear", {"x": x}, initializers={"s": np.float32(0.01)}, opset=13)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_dequantize_per_axis(axis):
    x = RNG.integers(-128, 127, (2, 3, 4)).astype(np.int8)
    n = x.shape[axis]
    inits = {
        "s": RNG.uniform(0.1, 1, n).astype(np.float32),
        "z": RNG.integers(-20, 20, n).astype(np.int8),
    }
    check_node("DequantizeLinear", {"x": x}, {"axis": axis}, initializers=inits, opset=13)


@pytest.mark.parametrize(
    ("shape", "axis", "block", "blocks"),
    [((3, 8), 1, 4, 2), ((3, 7), 1, 3, 3), ((6, 5), 0, 4, 2)],
    ids=["even", "short_last_block", "axis0"],
)
def test_dequantize_blocked(shape, axis, block, blocks):
    x = RNG.integers(0, 255, shape).astype(np.uint8)
    pshape = list(shape)
    pshape[axis] = blocks
    inits = {
        "s": RNG.uniform(0.05, 1, pshape).astype(np.float32),
        "z": RNG.integers(0, 255, pshape).astype(np.uint8),
    }
    attrs = {"axis": axis, "block_size": block}
    check_node("DequantizeLinear", {"x": x}, attrs, initializers=inits, opset=21)


@pytest.mark.parametrize(
    ("scale_type", "output_dtype"),
    [
        (np.float16, None),
        (np.float16, onnx.TensorProto.FLOAT),
        (np.float32, onnx.TensorProto.FLOAT16),
    ],
)
def test_dequantize_output_types(scale_type, output_dtype):
    x = RNG.integers(0, 255, 50).astype(np.uint8)
    attrs = {} if output_dtype is None else {"output_dtype": output_dtype}
    inits = {"s": np.array(0.37, scale_type), "z": np.uint8(3)}
    check_node("DequantizeLinear", {"x": x}, attrs, initializers=inits, opset=23, rtol=1e-3)


@pytest.mark.parametrize("dtype", FP8, ids=lambda d: d.__name__)
def test_dequantize_fp8(dtype):
    x = RNG.standard_normal(64).astype(np.float32).astype(dtype)
    nodes = [helper.make_node("DequantizeLinear", ["x8", "s"], ["y"])]
    # the fp8 input is made in the graph (ORT's Python API does not take fp8 arrays)
    nodes.insert(
        0,
        helper.make_node(
            "Cast", ["x"], ["x8"], to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        ),
    )
    xf = x.astype(np.float32)
    model = make_model(nodes, {"x": xf}, ["y"], {"s": np.array(2.0, np.float32)}, opset=21)
    np.testing.assert_array_equal(run_pgx(model, {"x": xf})[0], run_ort(model, {"x": xf})[0])


def test_quantize_dequantize_roundtrip_reference():
    x = RNG.standard_normal(100).astype(np.float32)
    s, z = np.float32(0.05), np.uint8(128)
    q = quantize(x, s, z, np.dtype(np.uint8))
    np.testing.assert_allclose(dequantize(q, s, z, np.dtype(np.float32)), x, atol=0.025 + 1e-6)


# --- DynamicQuantizeLinear --------------------------------------------------------------------
@pytest.mark.parametrize(
    "x",
    [
        RNG.standard_normal((3, 4)).astype(np.float32),
        np.abs(RNG.standard_normal(7)).astype(np.float32),
        -np.abs(RNG.standard_normal(7)).astype(np.float32),
        np.zeros((2, 3), np.float32),
        np.array(3.0, np.float32),
        (RNG.standard_normal((2, 3, 40)) * 100).astype(np.float32),
    ],
    ids=["mixed", "positive", "negative", "zeros", "scalar", "wide"],
)
def test_dynamic_quantize_linear(x):
    check_node("DynamicQuantizeLinear", {"x": x}, num_outputs=3, opset=11)


# --- errors -----------------------------------------------------------------------------------
def _parse(nodes, inputs, inits, opset=21):
    model = make_model(nodes, inputs, ["y"], inits, opset=opset)
    return run_pgx(model, inputs)


def test_error_bad_per_axis_length():
    x = np.zeros((2, 3), np.float32)
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1)
    with pytest.raises(OnnxParseError, match="axis 1 of the input"):
        _parse([node], {"x": x}, {"s": np.ones(2, np.float32)})


def test_error_bad_block_size():
    x = np.zeros((2, 8), np.float32)
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1, block_size=2)
    with pytest.raises(OnnxParseError, match="does not cover axis 1"):
        _parse([node], {"x": x}, {"s": np.ones((2, 2), np.float32)})


def test_error_unsupported_output_type():
    x = np.zeros(4, np.float32)
    # INT4 is supported since issue 11 (the ONNX node suite's quantizelinear_int4 checks it)
    node = helper.make_node(
        "QuantizeLinear", ["x", "s"], ["y"], output_dtype=onnx.TensorProto.INT32
    )
    with pytest.raises(OnnxParseError, match="int32_type is not a quantised type"):
        _parse([node], {"x": x}, {"s": np.ones((), np.float32)})
