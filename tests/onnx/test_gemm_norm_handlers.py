"""MatMul, Gemm, MatMulInteger, Softmax family and normalisation handlers against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import pygraphx
from pygraphx.onnx.errors import OnnxParseError
from pygraphx.onnx.registry import find_handler
from tests.helpers import assert_outputs_match, check_node, make_model, run_ort, run_pgx

RNG = np.random.default_rng(0)
TOL = {"rtol": 1e-4, "atol": 1e-5}


def f32(*lens: int) -> np.ndarray:
    return RNG.standard_normal(lens).astype(np.float32)


def parse(model: onnx.ModelProto) -> pygraphx.Program:
    return pygraphx.parse_onnx_buffer(model.SerializeToString())


def op_names(model: onnx.ModelProto) -> list[str]:
    main = parse(model).get_main_module()
    return [ins.op.name for ins in main if not ins.op.name.startswith("@")]


# --- MatMul ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b"),
    [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)),
     ((2, 1, 3, 4), (5, 4, 2)), ((1, 3, 4), (2, 1, 4, 6)), ((4,), (4, 5)), ((4,), (2, 4, 5)),
     ((3, 4), (4,)), ((2, 2, 3, 4), (4,)), ((4,), (4,))],
)  # fmt: skip
def test_matmul_broadcast_and_vectors(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    check_node("MatMul", {"a": f32(*a), "b": f32(*b)}, **TOL)


@pytest.mark.parametrize(("a", "b"), [((0, 4), (4, 3)), ((3, 0), (0, 2)), ((2, 0, 4), (4, 3))])
def test_matmul_empty(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    # constants: the parser reads a graph input's 0 dimension as unknown (default_dim_value)
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    model = make_model([node], {}, ["y"], {"a": f32(*a), "b": f32(*b)})
    assert_outputs_match(run_pgx(model, {}), run_ort(model, {}), **TOL)


def test_matmul_bert_shapes() -> None:
    # BERT's scales: activations ~N(0, 1) after LayerNorm, weights ~N(0, 0.02) (its initializer)
    check_node("MatMul", {"q": f32(1, 12, 128, 64), "k": f32(1, 12, 64, 128)}, **TOL)
    check_node("MatMul", {"x": f32(128, 768)}, initializers={"w": f32(768, 3072) * 0.02}, **TOL)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64])
def test_matmul_types(dtype: type) -> None:
    a = (f32(2, 3, 5) * 4).astype(dtype)
    b = (f32(5, 2) * 4).astype(dtype)
    tol = {"rtol": 2e-3, "atol": 2e-3} if dtype == np.float16 else TOL
    check_node("MatMul", {"a": a, "b": b}, **tol)


def test_matmul_ir_matches_migraphx() -> None:
    model = make_model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        {"a": f32(4), "b": f32(2, 4, 5)},
        ["y"],
    )
    assert op_names(model) == ["unsqueeze", "multibroadcast", "dot", "squeeze"]


def test_matmul_errors() -> None:
    model = make_model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": f32(3, 4)}, ["y"], {"b": f32(4, 5)}
    )
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(f32(5, 5), "b"))
    with pytest.raises(OnnxParseError, match="inner dimensions differ"):
        parse(model)
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [3, 4, 5])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxParseError, match=r"batch dimensions \[2\] and \[3\]"):
        parse(model)


# --- Gemm ------------------------------------------------------------------------------------
@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize(("alpha", "beta"), [(1.0, 1.0), (0.5, 1.0), (1.0, -2.0), (2.5, 0.25)])
def test_gemm_attributes(trans_a: int, trans_b: int, alpha: float, beta: float) -> None:
    m, k, n = 3, 5, 4
    a = f32(k, m) if trans_a else f32(m, k)
    b = f32(n, k) if trans_b else f32(k, n)
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta}
    check_node("Gemm", {"a": a, "b": b, "c": f32(m, n)}, attrs, **TOL)


@pytest.mark.parametrize("c_shape", [(), (1,), (4,), (3, 1), (1, 4), (3, 4), (1, 1)])
def test_gemm_broadcast_c(c_shape: tuple[int, ...]) -> None:
    c = np.asarray(RNG.standard_normal(c_shape), np.float32)
    check_node("Gemm", {"a": f32(3, 5), "b": f32(5, 4), "c": c}, {"beta": 0.5}, **TOL)


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
def test_gemm_opsets(opset: int) -> None:
    check_node("Gemm", {"a": f32(3, 5), "b": f32(4, 5), "c": f32(4)}, {"transB": 1}, opset=opset)


def test_gemm_without_c_and_zero_beta() -> None:
    check_node("Gemm", {"a": f32(3, 5), "b": f32(5, 4)}, {"alpha": 3.0}, opset=13, **TOL)
    c = np.full((3, 4), np.nan, np.float32)
    check_node("Gemm", {"a": f32(3, 5), "b": f32(5, 4), "c": c}, {"beta": 0.0}, **TOL)


def test_gemm_bert_dense() -> None:
    check_node(
        "Gemm", {"x": f32(128, 768)}, {"transB": 1},
        initializers={"w": f32(3072, 768) * 0.02, "bias": f32(3072)}, **TOL,
    )  # fmt: skip


def test_gemm_ir_skips_unit_alpha_beta() -> None:
    def names(alpha: float, beta: float) -> list[str]:
        node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=alpha, beta=beta, transA=1)
        model = make_model([node], {"a": f32(5, 3), "b": f32(5, 4), "c": f32(4)}, ["y"])
        return op_names(model)

    assert names(1.0, 1.0) == ["transpose", "dot", "multibroadcast", "add"]
    assert names(2.0, 3.0) == [
        "multibroadcast", "mul", "transpose", "dot", "multibroadcast", "multibroadcast", "mul",
        "add",
    ]  # fmt: skip


def test_gemm_errors() -> None:
    node = helper.make_node("Gemm", ["a", "b"], ["y"])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [2, 3, 5]),
         helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [5, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(OnnxParseError, match="A and B must be 2-D"):
        parse(model)


# --- MatMulInteger ---------------------------------------------------------------------------
def _ints(dtype: type, *lens: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, lens, dtype=dtype, endpoint=True)


@pytest.mark.parametrize(
    ("ta", "tb"), [(np.uint8, np.uint8), (np.int8, np.int8), (np.uint8, np.int8)]
)
def test_matmul_integer_no_zero_points(ta: type, tb: type) -> None:
    # exact integer products, not ONNX Runtime: ORT 1.32's u8 x s8 kernel saturates its
    # intermediate sums on CPUs without VNNI (off by up to 30,000 here)
    a, b = _ints(ta, 2, 3, 40), _ints(tb, 40, 5)
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    (y,) = run_pgx(make_model([node], {"a": a, "b": b}, ["y"], None, opset=10), {"a": a, "b": b})
    np.testing.assert_array_equal(y, a.astype(np.int32) @ b.astype(np.int32))


@pytest.mark.parametrize(("azp_shape", "bzp_shape"), [((), ()), ((1,), (1,)), ((), (5,))])
def test_matmul_integer_zero_points(azp_shape: tuple, bzp_shape: tuple) -> None:
    a, b = _ints(np.uint8, 3, 40), _ints(np.uint8, 40, 5)
    inits = {"azp": _ints(np.uint8, *azp_shape), "bzp": _ints(np.uint8, *bzp_shape)}
    check_node("MatMulInteger", {"a": a, "b": b}, initializers=inits, opset=10)


def _matmul_integer(a: np.ndarray, b: np.ndarray, azp: np.ndarray, bzp: np.ndarray) -> np.ndarray:
    """pygraphx's MatMulInteger (zero points as constants)."""
    node = helper.make_node("MatMulInteger", ["a", "b", "azp", "bzp"], ["y"])
    model = make_model([node], {"a": a, "b": b}, ["y"], {"azp": azp, "bzp": bzp}, opset=10)
    return run_pgx(model, {"a": a, "b": b})[0]


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_matmul_integer_per_row_zero_points(dtype: type) -> None:
    # ONNX allows per-row (A) and per-column (B) zero points; ONNX Runtime's CPU kernel does
    # not, so numpy is the oracle here
    a, b = _ints(dtype, 3, 40), _ints(dtype, 40, 3)
    azp, bzp = _ints(dtype, 3), _ints(dtype, 3)
    expected = (a.astype(np.int32) - azp[:, None].astype(np.int32)) @ (
        b.astype(np.int32) - bzp.astype(np.int32)
    )
    out = _matmul_integer(a, b, azp, bzp)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, expected)


def test_matmul_integer_batched_zero_points() -> None:
    a, b = _ints(np.int8, 2, 3, 8), _ints(np.int8, 2, 8, 4)
    azp, bzp = _ints(np.int8, 2, 3, 1), _ints(np.int8, 2, 1, 4)
    expected = (a.astype(np.int32) - azp) @ (b.astype(np.int32) - bzp)
    np.testing.assert_array_equal(_matmul_integer(a, b, azp, bzp), expected)
    # a zero-valued zero point keeps quant_dot
    node = helper.make_node("MatMulInteger", ["a", "b", "azp"], ["y"])
    model = make_model([node], {"a": a, "b": b}, ["y"], {"azp": np.zeros((), np.int8)}, opset=10)
    assert op_names(model) == ["quant_dot"]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(("a_shape", "b_shape"), [((3, 40), (40, 5)), ((2, 3, 16), (16, 4))])
def test_qlinear_matmul(dtype: type, a_shape: tuple, b_shape: tuple) -> None:
    inputs = {
        "a": _ints(dtype, *a_shape),
        "a_scale": np.array(0.02, np.float32),
        "a_zp": _ints(dtype),
        "b": _ints(dtype, *b_shape),
        "b_scale": np.array(0.005, np.float32),
        "b_zp": _ints(dtype),
        "y_scale": np.array(0.3, np.float32),
        "y_zp": _ints(dtype),
    }
    check_node("QLinearMatMul", inputs, opset=10)


# --- Softmax, LogSoftmax, Hardmax -----------------------------------------------------------
SOFTMAX_OPS = ["Softmax", "LogSoftmax", "Hardmax"]


@pytest.mark.parametrize("op", SOFTMAX_OPS)
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, 3, -1, -2, -4])
def test_softmax_family_axes(op: str, opset: int, axis: int | None) -> None:
    x = f32(2, 3, 4, 5) * 3
    attrs = {} if axis is None else {"axis": axis}
    check_node(op, {"x": x}, attrs, opset=opset, **TOL)


@pytest.mark.parametrize("op", SOFTMAX_OPS)
def test_softmax_family_transposed_input_opset11(op: str) -> None:
    # a non-standard input (after a transpose) through the pre-13 reshape path
    if find_handler("", "Transpose", 11) is None:
        pytest.skip("no ONNX Transpose handler yet")
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 1]),
        helper.make_node(op, ["t"], ["y"], axis=1),
    ]
    x = f32(3, 4, 5)
    model = make_model(nodes, {"x": x}, ["y"], opset=11)
    assert_outputs_match(run_pgx(model, {"x": x}), run_ort(model, {"x": x}), **TOL)


def test_softmax_bert_attention() -> None:
    check_node("Softmax", {"x": f32(1, 12, 128, 128) * 8}, {"axis": -1}, opset=13, **TOL)


def test_softmax_large_values_and_half() -> None:
    x = np.array([[1e4, 1e4 + 1, -1e4], [0, 0, 0]], np.float32)
    check_node("Softmax", {"x": x}, opset=13, **TOL)
    check_node("LogSoftmax", {"x": x}, opset=13, **TOL)
    check_node("Softmax", {"x": f32(3, 7).astype(np.float16)}, opset=13, rtol=2e-3, atol=1e-4)


def test_hardmax_ties_pick_first() -> None:
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [-1, -5, -1, -7]], np.float32)
    out = check_node("Hardmax", {"x": x}, opset=13)[0]
    np.testing.assert_array_equal(out, [[0, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]])


def test_softmax_errors() -> None:
    node = helper.make_node("Softmax", ["x"], ["y"], axis=3)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(OnnxParseError, match="axis 3 is out of range for an input of rank 2"):
        parse(model)


# --- LayerNormalization ----------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_normalization(axis: int, with_bias: bool) -> None:
    x = f32(2, 3, 8) * 2 + 1
    normalized = x.shape[axis:]
    inits = {"scale": f32(*normalized)}
    if with_bias:
        inits["bias"] = f32(*normalized)
    check_node(
        "LayerNormalization", {"x": x}, {"axis": axis, "epsilon": 1e-3}, num_outputs=3,
        initializers=inits, **TOL,
    )  # fmt: skip


def test_layer_normalization_bert() -> None:
    check_node(
        "LayerNormalization", {"x": f32(1, 128, 768)}, {"epsilon": 1e-12},
        initializers={"scale": f32(768), "bias": f32(768)}, **TOL,
    )  # fmt: skip


def test_layer_normalization_broadcast_scale_and_half() -> None:
    x = f32(2, 3, 8)
    check_node(
        "LayerNormalization", {"x": x}, {"axis": 1}, initializers={"scale": f32(1, 8)}, **TOL
    )
    xh = x.astype(np.float16)
    check_node(
        "LayerNormalization", {"x": xh}, {"axis": -1}, num_outputs=3,
        initializers={"scale": f32(8).astype(np.float16), "bias": f32(8).astype(np.float16)},
        rtol=2e-3, atol=2e-3,
    )  # fmt: skip


# --- GroupNormalization, RMSNormalization, MVN, LpNormalization --------------------------------
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("shape", [(2, 4, 3, 3), (3, 4, 5), (2, 4)])
def test_group_normalization_opset21(groups: int, shape: tuple[int, ...]) -> None:
    c = shape[1]
    check_node(
        "GroupNormalization", {"x": f32(*shape) * 3}, {"num_groups": groups, "epsilon": 1e-3},
        initializers={"scale": f32(c), "bias": f32(c)}, opset=21, **TOL,
    )  # fmt: skip


def test_group_normalization_opset18_per_group() -> None:
    x = f32(2, 6, 3, 2)
    model = make_model(
        [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3)],
        {"x": x}, ["y"], {"s": f32(3), "b": f32(3)}, opset=18,
    )  # fmt: skip
    (ours,) = run_pgx(model, {"x": x})
    s = onnx.numpy_helper.to_array(model.graph.initializer[0])
    b = onnx.numpy_helper.to_array(model.graph.initializer[1])
    g = x.reshape(2, 3, -1).astype(np.float64)
    norm = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)
    expected = (norm * s[None, :, None] + b[None, :, None]).reshape(x.shape)
    np.testing.assert_allclose(ours, expected, **TOL)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_rms_normalization(axis: int) -> None:
    import onnxruntime

    x = f32(2, 3, 8)
    scale = f32(*x.shape[axis:])
    try:
        check_node(
            "RMSNormalization", {"x": x}, {"axis": axis, "epsilon": 1e-4},
            initializers={"scale": scale}, opset=23, **TOL,
        )  # fmt: skip
    except onnxruntime.capi.onnxruntime_pybind11_state.Fail as exc:  # pragma: no cover
        pytest.skip(f"ONNX Runtime lacks RMSNormalization: {exc}")


@pytest.mark.parametrize("axes", [(0, 2, 3), (1,), (2, 3), (-1,)])
def test_mean_variance_normalization(axes: tuple[int, ...]) -> None:
    check_node("MeanVarianceNormalization", {"x": f32(2, 3, 4, 5) * 2 + 1}, {"axes": axes}, **TOL)


def test_mean_variance_normalization_default_axes() -> None:
    # built without onnx's strict shape inference, which fails on MVN's function body here
    x = f32(2, 3, 4, 5) * 2 + 1
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"])
    info = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, x.shape) for n in "xy"]
    model = helper.make_model(
        helper.make_graph([node], "g", info[:1], info[1:]),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    model.ir_version = 8
    assert_outputs_match(run_pgx(model, {"x": x}), run_ort(model, {"x": x}), **TOL)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_lp_normalization(p: int, axis: int) -> None:
    x = f32(3, 4, 5)
    x[1, 2, :] = 0  # a zero slice along the last axis
    check_node("LpNormalization", {"x": x}, {"p": p, "axis": axis}, **TOL)
