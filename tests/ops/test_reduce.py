"""IR reductions, arg/top-k, prefix scans and the misc ops: shapes (and ShapeError) and numerics
against numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from pygraphx.ir.shape import Shape, from_dtype
from pygraphx.ops import ShapeError, make_op
from pygraphx.ops.misc import bitshift, einsum_lens

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def run(op, *arrays: np.ndarray) -> np.ndarray:
    """compute_shape then compute, checking the result agrees with the shape."""
    shapes = [Shape(from_dtype(a.dtype), a.shape) for a in arrays]
    out_shape = op.compute_shape(shapes)
    out = np.asarray(op.compute(out_shape, list(arrays)))
    assert list(out.shape) == out_shape.lens()
    assert out.dtype == out_shape.dtype()
    return out


# --- reduce_* ---------------------------------------------------------------------------------
REDUCERS = {
    "reduce_sum": np.sum,
    "reduce_mean": np.mean,
    "reduce_max": np.max,
    "reduce_min": np.min,
    "reduce_prod": np.prod,
}


@pytest.mark.parametrize("name", list(REDUCERS))
@pytest.mark.parametrize("axes", [(), (0,), (1,), (-1,), (0, 2), (2, 0), (0, 1, 2)])
def test_reduce_matches_numpy(name: str, axes: tuple[int, ...]) -> None:
    op = make_op(name, axes=axes)
    out = run(op, X)
    want = REDUCERS[name](X, axis=axes or None, keepdims=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_reduce_shape_keeps_dims_and_type() -> None:
    s = make_op("reduce_sum", axes=(1, -1)).compute_shape([Shape("half_type", [2, 3, 4])])
    assert s == Shape("half_type", [2, 1, 1])
    assert make_op("reduce_max", axes=()).compute_shape([Shape("int8_type", [5, 6])]).lens() == [
        1,
        1,
    ]
    assert str(make_op("reduce_mean", axes=[1, 2])) == "reduce_mean[axes={1, 2}]"


@pytest.mark.parametrize(
    ("axes", "inputs", "match"),
    [((3,), [Shape("float_type", [2, 3, 4])], "out of range"),
     ((-4,), [Shape("float_type", [2, 3, 4])], "out of range"),
     ((1, -2), [Shape("float_type", [2, 3, 4])], "twice"),
     ((0,), [Shape("float_type", [2]), Shape("float_type", [2])], "expected 1 input"),
     ((0,), [Shape("float_type", [])], "scalar")],
)  # fmt: skip
def test_reduce_shape_errors(axes: tuple[int, ...], inputs: list[Shape], match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        make_op("reduce_sum", axes=axes).compute_shape(inputs)


@pytest.mark.parametrize(
    ("name", "dtype", "want"),
    [("reduce_sum", np.float32, 0.0), ("reduce_prod", np.float32, 1.0),
     ("reduce_max", np.float32, -np.inf), ("reduce_min", np.float32, np.inf),
     ("reduce_max", np.int32, np.iinfo(np.int32).min),
     ("reduce_min", np.uint8, 255), ("reduce_max", np.bool_, False),
     ("reduce_min", np.bool_, True), ("reduce_sum", np.int64, 0),
     ("reduce_mean", np.float32, 0.0), ("reduce_mean", np.int32, 0)],
)  # fmt: skip
def test_empty_reduction_gives_identity(name: str, dtype: type, want: object) -> None:
    x = np.zeros((2, 0, 4), dtype)
    out = run(make_op(name, axes=(1,)), x)
    assert out.shape == (2, 1, 4)
    np.testing.assert_array_equal(out, np.full((2, 1, 4), want, dtype))


def test_reduce_scalar_with_no_axes_is_identity() -> None:
    x = np.array(2.5, np.float32)
    assert run(make_op("reduce_prod", axes=()), x).tolist() == 2.5


def test_empty_non_reduced_axis() -> None:
    out = run(make_op("reduce_sum", axes=(2,)), np.zeros((2, 0, 4), np.float32))
    assert out.shape == (2, 0, 1)


def test_integer_reductions_stay_in_type() -> None:
    x = np.array([[100, 100, 100], [-7, 2, 0]], np.int8)
    np.testing.assert_array_equal(run(make_op("reduce_sum", axes=(1,)), x), [[44], [-5]])
    # mean truncates toward zero, as ONNX Runtime does
    y = np.array([[1, 2], [-1, -2], [-3, -4], [7, 0]], np.int32)
    np.testing.assert_array_equal(run(make_op("reduce_mean", axes=(1,)), y), [[1], [-1], [-3], [3]])
    u = np.full((300,), 255, np.uint8)
    assert run(make_op("reduce_mean", axes=(0,)), u).tolist() == [255]


def test_half_precision_accumulates_in_float32() -> None:
    x = np.full((4096,), 1.0, np.float16)
    assert run(make_op("reduce_sum", axes=(0,)), x)[0] == 4096.0
    b = np.ones((3, 5), ml_dtypes.bfloat16)
    out = run(make_op("reduce_mean", axes=(1,)), b)
    assert out.dtype == ml_dtypes.bfloat16 and float(out[0, 0]) == 1.0


def test_bool_max_min() -> None:
    b = np.array([[True, False], [False, False]])
    np.testing.assert_array_equal(run(make_op("reduce_max", axes=(1,)), b), [[True], [False]])
    np.testing.assert_array_equal(run(make_op("reduce_min", axes=(0,)), b), [[False, False]])


# --- argmax / argmin --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_arg_matches_numpy(name: str, axis: int) -> None:
    out = run(make_op(name, axis=axis), X)
    want = getattr(np, name)(X, axis=axis, keepdims=True)
    np.testing.assert_array_equal(out, want)
    assert out.dtype == np.int64


def test_arg_select_last_index() -> None:
    x = np.array([[2, 5, 5, 1], [0, 0, 3, 3]], np.int32)
    assert run(make_op("argmax", axis=1), x).ravel().tolist() == [1, 2]
    assert run(make_op("argmax", axis=1, select_last_index=True), x).ravel().tolist() == [2, 3]
    assert run(make_op("argmin", axis=1, select_last_index=True), x).ravel().tolist() == [3, 1]


def test_arg_shape_errors() -> None:
    with pytest.raises(ShapeError, match="out of range"):
        make_op("argmax", axis=3).compute_shape([Shape("float_type", [2, 3, 4])])
    with pytest.raises(ShapeError, match="empty"):
        make_op("argmin", axis=1).compute_shape([Shape("float_type", [2, 0])])
    with pytest.raises(ShapeError, match="scalar"):
        make_op("argmax").compute_shape([Shape("float_type", [])])


# --- topk -------------------------------------------------------------------------------------
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_topk_matches_sorting(largest: bool, axis: int) -> None:
    k = 2
    values = run(make_op("topk", k=k, axis=axis, largest=largest, output=0), X)
    indices = run(make_op("topk", k=k, axis=axis, largest=largest, output=1), X)
    order = np.argsort(-X if largest else X, axis=axis, kind="stable")
    want_idx = np.take(order, np.arange(k), axis=axis)
    np.testing.assert_array_equal(indices, want_idx)
    np.testing.assert_array_equal(values, np.take_along_axis(X, want_idx, axis=axis))
    assert indices.dtype == np.int64 and values.dtype == np.float32


def test_topk_ties_take_lower_index_first() -> None:
    x = np.array([[3, 1, 3, 2, 3, 1]], np.uint64)
    assert run(make_op("topk", k=4, output=1), x).tolist() == [[0, 2, 4, 3]]
    assert run(make_op("topk", k=3, largest=False, output=1), x).tolist() == [[1, 5, 3]]
    i8 = np.array([-128, 127, -128, 127], np.int8)
    assert run(make_op("topk", k=4, output=1), i8).tolist() == [1, 3, 0, 2]


def test_topk_shape() -> None:
    s = make_op("topk", k=3, axis=1, output=0).compute_shape([Shape("half_type", [2, 5])])
    assert s == Shape("half_type", [2, 3])
    s = make_op("topk", k=0, axis=0, output=1).compute_shape([Shape("half_type", [2, 5])])
    assert s == Shape("int64_type", [0, 5])
    with pytest.raises(ShapeError, match="k=6"):
        make_op("topk", k=6).compute_shape([Shape("float_type", [2, 5])])
    with pytest.raises(ShapeError, match="output"):
        make_op("topk", k=1, output=2).compute_shape([Shape("float_type", [2, 5])])


# --- prefix_scan_sum --------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_prefix_scan_sum(axis: int, exclusive: bool, reverse: bool) -> None:
    op = make_op("prefix_scan_sum", axis=axis, exclusive=exclusive, reverse=reverse)
    out = run(op, X)
    x = np.flip(X, axis) if reverse else X
    want = np.cumsum(x, axis=axis)
    if exclusive:
        want = want - x
    if reverse:
        want = np.flip(want, axis)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_prefix_scan_sum_int_and_errors() -> None:
    x = np.array([1, 2, 3, 4], np.int32)
    op = make_op("prefix_scan_sum", axis=0, exclusive=True, reverse=True)
    assert run(op, x).tolist() == [9, 7, 4, 0]
    assert run(make_op("prefix_scan_sum", axis=0), np.zeros((0,), np.int32)).shape == (0,)
    with pytest.raises(ShapeError, match="out of range"):
        make_op("prefix_scan_sum", axis=2).compute_shape([Shape("float_type", [2, 3])])


# --- einsum, det, isinf, bitshift -------------------------------------------------------------
@pytest.mark.parametrize(
    ("equation", "shapes"),
    [("ij->ji", [(3, 4)]), ("ij->i", [(3, 4)]), ("...ii ->...i", [(2, 3, 3)]),
     ("i,i", [(5,), (5,)]), ("bij, bjk -> bik", [(2, 3, 4), (2, 4, 5)]), ("ij", [(3, 4)]),
     ("ji", [(3, 4)]), ("ij,jk", [(3, 4), (4, 5)]), ("...j,j->...", [(2, 1, 4), (4,)]),
     ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]), ("ii->", [(3, 3)]),
     ("i,j->ij", [(2,), (3,)])],
)  # fmt: skip
def test_einsum_matches_numpy(equation: str, shapes: list[tuple[int, ...]]) -> None:
    arrays = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    out = run(make_op("einsum", equation=equation), *arrays)
    want = np.einsum(equation.replace(" ", ""), *arrays)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("equation", "lens", "match"),
    [("ij,jk->ik", [[3, 4], [5, 6]], "lengths"), ("ij->ik", [[3, 4]], "not inputs"),
     ("ijk->i", [[3, 4]], "rank"), ("ij,jk", [[3, 4]], "operand"),
     ("...i,...i->...i", [[2, 3], [4, 3]], "broadcast"), ("i->ii", [[3]], "repeats")],
)  # fmt: skip
def test_einsum_shape_errors(equation: str, lens: list[list[int]], match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        einsum_lens(equation, lens)


def test_einsum_bf16_and_copy() -> None:
    x = RNG.standard_normal((3, 4)).astype(ml_dtypes.bfloat16)
    out = run(make_op("einsum", equation="ij->ji"), x)
    np.testing.assert_array_equal(out.astype(np.float32), x.astype(np.float32).T)
    assert not np.shares_memory(out, x)


def test_det() -> None:
    x = RNG.standard_normal((2, 3, 3, 3)).astype(np.float32)
    out = run(make_op("det"), x)
    np.testing.assert_allclose(out, np.linalg.det(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="square"):
        make_op("det").compute_shape([Shape("float_type", [2, 3])])
    with pytest.raises(ShapeError, match="floating"):
        make_op("det").compute_shape([Shape("int32_type", [3, 3])])


def test_isinf() -> None:
    x = np.array([np.inf, -np.inf, np.nan, 0.0, 1e38], np.float32)
    assert run(make_op("isinf"), x).tolist() == [True, True, False, False, False]


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64])
def test_bitshift_in_range_matches_numpy(dtype: type) -> None:
    x = np.array([1, 2, 7, 100], dtype)
    y = np.array([0, 1, 3, 5], dtype)
    np.testing.assert_array_equal(bitshift(x, y, True), np.left_shift(x, y))
    np.testing.assert_array_equal(bitshift(x, y, False), np.right_shift(x, y))


def test_bitshift_out_of_range_and_overflow() -> None:
    x = np.array([-8, 4, -1, 64], np.int8)
    y = np.array([8, -1, 127, 1], np.int8)
    left = run(make_op("bitshift", direction="left"), x, y)
    right = run(make_op("bitshift", direction="right"), x, y)
    assert left.tolist() == [0, 0, 0, -128]
    assert right.tolist() == [-1, 0, -1, 32]
    with pytest.raises(ShapeError, match="integer"):
        make_op("bitshift").compute_shape([Shape("float_type", [2])] * 2)
    with pytest.raises(ShapeError, match="direction"):
        make_op("bitshift", direction="up").compute_shape([Shape("int32_type", [2])] * 2)
