"""Reduction, ArgMax/ArgMin, TopK, CumSum and misc (Shrink, Det, Einsum, IsInf, BitShift) ONNX
handlers against ONNX Runtime, over axes, keepdims and the opset versions that differ.

The last section runs ONNX's own node tests for these ops with their shape-like inputs (axes, K,
the CumSum axis) baked into initialisers: the backend adapter feeds them as runtime inputs, which
the static-shape frontend cannot take, so this is where the handlers meet those cases.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from pygraphx.onnx.errors import OnnxParseError
from tests.helpers import check_node, make_model, run_pgx

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4, 5)).astype(np.float32)
POS = (np.abs(X) + 0.1).astype(np.float32)

REDUCE_OPS = [
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
]  # fmt: skip


def _axes_is_input(op: str, opset: int) -> bool:
    return opset >= (13 if op == "ReduceSum" else 18)


def check_reduce(
    op: str,
    x: np.ndarray,
    axes: tuple[int, ...] | None,
    opset: int,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    **attrs: int,
) -> list[np.ndarray]:
    """check_node for a reduction, with axes as attribute or constant input as `opset` wants."""
    inits = {}
    if axes is not None:
        if _axes_is_input(op, opset):
            inits["axes"] = np.array(axes, np.int64)
        else:
            attrs["axes"] = list(axes)
    return check_node(op, {"x": x}, attrs, initializers=inits, opset=opset, rtol=rtol, atol=atol)


# --- reductions -------------------------------------------------------------------------------
@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("axes", [None, (1,), (-1,), (0, 2), (2, 0, 1)])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce(op: str, opset: int, axes: tuple[int, ...] | None, keepdims: int) -> None:
    x = POS if op in ("ReduceLogSum", "ReduceProd") else X
    check_reduce(op, x, axes, opset, rtol=1e-4, atol=1e-5, keepdims=keepdims)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_empty_axes_input_reduces_all(op: str, keepdims: int) -> None:
    x = POS if op in ("ReduceLogSum", "ReduceProd") else X
    check_reduce(op, x, (), 18, rtol=1e-4, atol=1e-5, keepdims=keepdims)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("empty_input", [False, True])
def test_reduce_noop_with_empty_axes(op: str, empty_input: bool) -> None:
    # no axes: the reduction is skipped; the element-wise parts still apply (as ORT does)
    x = POS if op in ("ReduceLogSum", "ReduceProd") else X
    check_reduce(op, x, () if empty_input else None, 18, noop_with_empty_axes=1)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_empty_set(op: str, keepdims: int) -> None:
    # reducing a zero-length axis gives the identity (0, 1, -inf, +inf, log 0 = -inf, ...)
    check_reduce(op, np.zeros((2, 0, 4), np.float32), (1,), 18, keepdims=keepdims)


def test_reduce_empty_non_reduced_axis() -> None:
    check_reduce("ReduceSum", np.zeros((2, 0, 4), np.float32), (2,), 13, keepdims=1)


@pytest.mark.parametrize(
    ("op", "dtype"),
    [("ReduceSum", np.int32), ("ReduceSum", np.int64), ("ReduceMean", np.int32),
     ("ReduceMax", np.int32), ("ReduceMax", np.int8), ("ReduceMax", np.uint8),
     ("ReduceMin", np.int64), ("ReduceMin", np.uint8), ("ReduceProd", np.int64),
     ("ReduceL1", np.int32), ("ReduceSumSquare", np.int64), ("ReduceSum", np.float64),
     ("ReduceMean", np.float16), ("ReduceMax", np.float16)],
)  # fmt: skip
@pytest.mark.parametrize("axes", [(1,), None])
def test_reduce_types(op: str, dtype: type, axes: tuple[int, ...] | None) -> None:
    if np.issubdtype(dtype, np.integer):
        lo = 0 if np.issubdtype(dtype, np.unsignedinteger) else -9
        x = RNG.integers(lo, 10, (3, 4, 5)).astype(dtype)
        if op == "ReduceProd":
            x = RNG.integers(-3, 4, (3, 4, 2)).astype(dtype)
    else:
        x = X.astype(dtype)
    tol = 1e-2 if dtype == np.float16 else 1e-6
    check_reduce(op, x, axes, 18, rtol=tol, atol=tol, keepdims=0)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_reduce_empty_set_typed(op: str, dtype: type) -> None:
    check_reduce(op, np.zeros((3, 0), dtype), (1,), 18, keepdims=1)


def test_reduce_log_sum_exp_is_stable() -> None:
    x = np.array([[1000.0, 1000.0, 999.0], [-1000.0, -1001.0, -1e4], [0.0, 1.0, 2.0]], np.float32)
    out = check_reduce("ReduceLogSumExp", x, (1,), 18, keepdims=0)
    assert np.all(np.isfinite(out[0]))
    inf = np.array([[-np.inf, -np.inf], [np.inf, 1.0], [-np.inf, 3.0]], np.float32)
    out = check_reduce("ReduceLogSumExp", inf, (1,), 18, keepdims=0)
    assert out[0].tolist() == [-np.inf, np.inf, 3.0]


def test_reduce_scalar_input() -> None:
    check_reduce("ReduceSum", np.array(3.0, np.float32), None, 13, keepdims=0)
    check_reduce("ReduceL2", np.array(-3.0, np.float32), None, 18, keepdims=1)


def test_reduce_runtime_axes_is_a_clear_error() -> None:
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"])
    feeds = {"x": X, "axes": np.array([1], np.int64)}
    model = make_model([node], feeds, ["y"], opset=13)
    with pytest.raises(OnnxParseError, match="'axes' must be known at compile time"):
        run_pgx(model, feeds, specialize_on_input_values=False)


def test_reduce_bad_axes() -> None:
    node = helper.make_node("ReduceMax", ["x"], ["y"], axes=[1, -2])
    model = make_model([node], {"x": X}, [], opset=13)
    with pytest.raises(OnnxParseError, match="twice"):
        run_pgx(model, {"x": X})


# --- ArgMax / ArgMin --------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [0, 1, -1, None])
@pytest.mark.parametrize("keepdims", [0, 1, None])
def test_arg(op: str, opset: int, axis: int | None, keepdims: int | None) -> None:
    attrs = {k: v for k, v in {"axis": axis, "keepdims": keepdims}.items() if v is not None}
    check_node(op, {"x": X}, attrs, opset=opset)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("select_last_index", [0, 1])
@pytest.mark.parametrize("axis", [0, 1])
def test_arg_ties(op: str, select_last_index: int, axis: int) -> None:
    x = RNG.integers(0, 3, (4, 6)).astype(np.int32)
    attrs = {"axis": axis, "select_last_index": select_last_index, "keepdims": 0}
    check_node(op, {"x": x}, attrs, opset=13)


# --- TopK -------------------------------------------------------------------------------------
def test_topk_v1() -> None:
    check_node("TopK", {"x": X}, {"k": 3, "axis": 1}, num_outputs=2, opset=1)


@pytest.mark.parametrize("opset", [10, 11])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("k", [0, 1, 3])
def test_topk(opset: int, axis: int, k: int) -> None:
    check_node(
        "TopK", {"x": X}, {"axis": axis}, num_outputs=2, opset=opset,
        initializers={"k": np.array([k], np.int64)},
    )  # fmt: skip


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float64])
def test_topk_ties_and_types(largest: int, dtype: type) -> None:
    x = RNG.integers(0, 4, (3, 8)).astype(dtype)
    check_node(
        "TopK", {"x": x}, {"largest": largest, "sorted": 1}, num_outputs=2, opset=11,
        initializers={"k": np.array([5], np.int64)},
    )  # fmt: skip


def test_topk_k_too_large() -> None:
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"])
    graph = helper.make_graph(
        [node], "topk", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, X.shape)],
        [onnx.ValueInfoProto(name="v"), onnx.ValueInfoProto(name="i")],
        [numpy_helper.from_array(np.array([9], np.int64), "k")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    with pytest.raises(OnnxParseError, match="k=9"):
        run_pgx(model, {"x": X})


# --- CumSum -----------------------------------------------------------------------------------
@pytest.mark.parametrize("opset", [11, 14])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum(opset: int, axis: int, exclusive: int, reverse: int) -> None:
    check_node(
        "CumSum", {"x": X}, {"exclusive": exclusive, "reverse": reverse}, opset=opset,
        initializers={"axis": np.array(axis, np.int32)}, rtol=1e-5, atol=1e-5,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_cumsum_types(dtype: type) -> None:
    x = RNG.integers(-5, 5, (4, 5)).astype(dtype)
    check_node(
        "CumSum", {"x": x}, {"exclusive": 1}, opset=14,
        initializers={"axis": np.array([1], np.int64)},
    )  # fmt: skip


# --- Shrink, Det, Einsum, IsInf, BitShift -----------------------------------------------------
@pytest.mark.parametrize(
    "attrs", [{}, {"lambd": 1.5}, {"lambd": 0.5, "bias": 0.5}, {"lambd": 0.0, "bias": -1.0}]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int8])
def test_shrink(attrs: dict, dtype: type) -> None:
    x = (X * 3).astype(dtype)
    check_node("Shrink", {"x": x}, attrs, opset=9)


def test_shrink_unsigned() -> None:
    x = np.arange(10, dtype=np.uint8)
    check_node("Shrink", {"x": x}, {"lambd": 3.0, "bias": 1.0}, opset=9)


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 3, 2, 2), (1, 1)])
def test_det(shape: tuple[int, ...]) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    check_node("Det", {"x": x}, opset=11, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [("ij->ji", [(3, 4)]), ("ij->i", [(3, 4)]), ("...ii->...i", [(2, 3, 3)]),
     ("i,i", [(5,), (5,)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ij,jk", [(3, 4), (4, 5)]),
     ("...j,j->...", [(2, 3, 4), (4,)]), ("ii", [(3, 3)]), ("i,j->ij", [(2,), (3,)]),
     ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)])],
)  # fmt: skip
def test_einsum(equation: str, shapes: list[tuple[int, ...]]) -> None:
    inputs = {f"x{k}": RNG.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)}
    check_node("Einsum", inputs, {"equation": equation}, opset=12, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positive", [0, 1])
@pytest.mark.parametrize("negative", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_isinf(positive: int, negative: int, dtype: type) -> None:
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -1.0, 3e38], dtype)
    attrs = {"detect_positive": positive, "detect_negative": negative}
    check_node("IsInf", {"x": x}, attrs, opset=10)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64])  # ORT has no uint16
def test_bitshift(direction: str, dtype: type) -> None:
    x = RNG.integers(0, 200, (3, 4)).astype(dtype)
    y = RNG.integers(0, 8, (4,)).astype(dtype)
    check_node("BitShift", {"x": x, "y": y}, {"direction": direction}, opset=11)


# --- ONNX's node tests with their shape inputs made constant ----------------------------------
_NODE_TESTS = re.compile(
    r"^test_(reduce_|argmax|argmin|top_k|cumsum|shrink|det_|einsum|isinf|bitshift)"
)
# inputs a static-shape frontend needs at compile time: (op type, input slot)
_SHAPE_SLOTS = {(op, 1) for op in REDUCE_OPS} | {("TopK", 1), ("CumSum", 1)}


def _node_cases() -> dict[str, object]:
    from onnx.backend.test.loader import load_node_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_node_model_tests()
    return {c.name: c for c in cases if _NODE_TESTS.match(c.name) and "expanded" not in c.name}


_CASES = _node_cases()


def _bake_shape_inputs(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray]
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Move graph inputs used as axes/K/axis into initialisers holding the fed values."""
    names = {
        node.input[k]
        for node in model.graph.node
        for k in range(len(node.input))
        if (node.op_type, k) in _SHAPE_SLOTS
    }
    baked = onnx.ModelProto()
    baked.CopyFrom(model)
    keep = [i for i in baked.graph.input if i.name not in names]
    del baked.graph.input[:]
    baked.graph.input.extend(keep)
    for name in sorted(names & set(feeds)):
        baked.graph.initializer.append(numpy_helper.from_array(feeds[name], name))
    return baked, {k: v for k, v in feeds.items() if k not in names}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_onnx_node_case_with_constant_shape_inputs(name: str) -> None:
    case = _CASES[name]
    model = case.model
    for inputs, outputs in case.data_sets:
        feeds = {i.name: np.asarray(v) for i, v in zip(model.graph.input, inputs, strict=True)}
        baked, rest = _bake_shape_inputs(model, feeds)
        ours = run_pgx(baked, rest)
        assert len(ours) == len(outputs)
        for got, want in zip(ours, outputs, strict=True):
            want = np.asarray(want)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_allclose(
                got.astype(np.float64) if got.dtype.kind == "V" else got,
                want.astype(np.float64) if want.dtype.kind == "V" else want,
                rtol=case.rtol,
                atol=case.atol,
                err_msg=name,
            )
