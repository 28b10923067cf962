"""The `dot`, `quant_dot`, `softmax` and `logsoftmax` IR operators: shapes, errors, numpy values."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special

from pygraphx.ir.shape import Shape
from pygraphx.ops import ShapeError, make_op

RNG = np.random.default_rng(0)


def run(op_name: str, *arrays: np.ndarray, **attrs: object) -> np.ndarray:
    """compute_shape then compute, checking the result against the shape as the evaluator does."""
    op = make_op(op_name, **attrs)
    shapes = [Shape(a.dtype, a.shape, [s // a.itemsize for s in a.strides]) for a in arrays]
    out_shape = op.compute_shape(shapes)
    out = np.asarray(op.compute(out_shape, list(arrays)))
    assert list(out.shape) == out_shape.lens()
    assert out.dtype == out_shape.dtype()
    return out


def f32(*lens: int) -> np.ndarray:
    return RNG.standard_normal(lens).astype(np.float32)


# --- dot ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b", "out"),
    [([3, 4], [4, 5], [3, 5]), ([2, 3, 4], [2, 4, 5], [2, 3, 5]),
     ([1, 12, 128, 64], [1, 12, 64, 128], [1, 12, 128, 128]),
     ([2, 1, 0, 4], [2, 1, 4, 3], [2, 1, 0, 3])],
)  # fmt: skip
def test_dot_shape(a: list[int], b: list[int], out: list[int]) -> None:
    s = make_op("dot").compute_shape([Shape("float_type", a), Shape("float_type", b)])
    assert s == Shape("float_type", out)


@pytest.mark.parametrize(
    ("a", "b", "types", "message"),
    [([3, 4], [5, 6], ("float_type",) * 2, "inner dimensions differ"),
     ([2, 3, 4], [3, 4, 5], ("float_type",) * 2, "batch dimensions differ"),
     ([1, 3, 4], [2, 4, 5], ("float_type",) * 2, "batch dimensions differ"),
     ([3, 4], [2, 4, 5], ("float_type",) * 2, "same rank"),
     ([4], [4, 5], ("float_type",) * 2, "rank 2 or more"),
     ([3, 4], [4, 5], ("float_type", "half_type"), "different types"),
     ([3, 4], [4, 5], ("bool_type",) * 2, "bool_type")],
)  # fmt: skip
def test_dot_shape_errors(a: list[int], b: list[int], types: tuple, message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        make_op("dot").compute_shape([Shape(types[0], a), Shape(types[1], b)])


def test_dot_arity() -> None:
    with pytest.raises(ShapeError, match="expected 2 inputs, got 1"):
        make_op("dot").compute_shape([Shape("float_type", [2, 2])])


def test_dot_float32_bert_shapes() -> None:
    a, b = f32(1, 12, 128, 64), f32(1, 12, 64, 128)
    np.testing.assert_allclose(run("dot", a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-5)
    a, b = f32(128, 768), f32(768, 3072)
    np.testing.assert_allclose(run("dot", a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_dot_strided_views() -> None:
    # transposed and broadcast inputs (views) are read, never written
    a = f32(5, 3).T
    b = np.broadcast_to(f32(1, 5, 4)[0], (5, 4))
    b_copy = b.copy()
    np.testing.assert_allclose(run("dot", a, b), a @ b_copy, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(b, b_copy)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_dot_other_floats(dtype: type) -> None:
    a, b = f32(2, 3, 8).astype(dtype), f32(2, 8, 4).astype(dtype)
    expected = (a.astype(np.float64) @ b.astype(np.float64)).astype(dtype)
    out = run("dot", a, b)
    tol = 1e-2 if dtype == np.float16 else 1e-12
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_dot_integers_wrap(dtype: type) -> None:
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (3, 7), dtype=dtype, endpoint=True)
    b = RNG.integers(info.min, info.max, (7, 2), dtype=dtype, endpoint=True)
    with np.errstate(over="ignore"):
        expected = np.matmul(a, b)  # accumulation in the type itself, wrapping
    np.testing.assert_array_equal(run("dot", a, b), expected)


def test_dot_bf16() -> None:
    import ml_dtypes

    a = f32(4, 8).astype(ml_dtypes.bfloat16)
    b = f32(8, 3).astype(ml_dtypes.bfloat16)
    out = run("dot", a, b)
    expected = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(out.astype(np.float32), expected, rtol=1e-2, atol=1e-2)


# --- quant_dot -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ta", "tb"), [(np.int8, np.int8), (np.uint8, np.uint8), (np.uint8, np.int8)]
)
def test_quant_dot_accumulates_int32(ta: type, tb: type) -> None:
    a = RNG.integers(np.iinfo(ta).min, np.iinfo(ta).max, (2, 3, 300), dtype=ta, endpoint=True)
    b = RNG.integers(np.iinfo(tb).min, np.iinfo(tb).max, (2, 300, 5), dtype=tb, endpoint=True)
    out = run("quant_dot", a, b)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))


def test_quant_dot_shape_errors() -> None:
    qd = make_op("quant_dot")
    with pytest.raises(ShapeError, match="int8/uint8 or one fp8 type"):
        qd.compute_shape([Shape("float_type", [2, 3]), Shape("float_type", [3, 2])])
    with pytest.raises(ShapeError, match="inner dimensions differ"):
        qd.compute_shape([Shape("int8_type", [2, 3]), Shape("int8_type", [4, 2])])
    fp8 = qd.compute_shape([Shape("fp8e4m3fn_type", [2, 3]), Shape("fp8e4m3fn_type", [3, 2])])
    assert fp8 == Shape("float_type", [2, 2])


def test_printing() -> None:
    assert str(make_op("dot")) == "dot"
    assert str(make_op("softmax", axis=-1)) == "softmax[axis=-1]"
    assert str(make_op("logsoftmax")) == "logsoftmax[axis=1]"


# --- softmax / logsoftmax --------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_softmax_values(axis: int) -> None:
    x = f32(2, 3, 4, 5) * 4
    np.testing.assert_allclose(
        run("softmax", x, axis=axis), scipy.special.softmax(x, axis=axis), rtol=1e-5, atol=1e-7
    )
    np.testing.assert_allclose(
        run("logsoftmax", x, axis=axis),
        scipy.special.log_softmax(x, axis=axis),
        rtol=1e-5,
        atol=1e-5,
    )


def test_softmax_bert_attention_shape() -> None:
    x = f32(1, 12, 128, 128) * 8
    out = run("softmax", x, axis=3)
    np.testing.assert_allclose(out, scipy.special.softmax(x, axis=3), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out.sum(axis=3), 1, rtol=1e-5)


def test_softmax_is_stable_for_large_inputs() -> None:
    x = np.array([[1000.0, 1001.0, 1002.0], [-1e30, 0.0, 1e30]], np.float32)
    out = run("softmax", x, axis=1)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out[0], scipy.special.softmax([0.0, 1.0, 2.0]), rtol=1e-6)
    np.testing.assert_allclose(out[1], [0, 0, 1])
    log = run("logsoftmax", x, axis=1)
    np.testing.assert_allclose(log[0], scipy.special.log_softmax([0.0, 1.0, 2.0]), rtol=1e-6)


def test_softmax_infinities() -> None:
    x = np.array([[-np.inf, 0.0, -np.inf], [-np.inf, -np.inf, -np.inf]], np.float32)
    out = run("softmax", x, axis=1)
    np.testing.assert_array_equal(out[0], [0, 1, 0])
    assert np.all(np.isnan(out[1]))  # 0 / 0, as ONNX Runtime gives


def test_softmax_half_computes_in_float32() -> None:
    x = (f32(4, 50) * 3).astype(np.float16)
    out = run("softmax", x, axis=1)
    assert out.dtype == np.float16
    expected = scipy.special.softmax(x.astype(np.float64), axis=1)
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("name", ["softmax", "logsoftmax"])
def test_softmax_shape_errors(name: str) -> None:
    with pytest.raises(ShapeError, match="axis 3 is out of range for rank 3"):
        make_op(name, axis=3).compute_shape([Shape("float_type", [2, 3, 4])])
    with pytest.raises(ShapeError, match="axis -4 is out of range"):
        make_op(name, axis=-4).compute_shape([Shape("float_type", [2, 3, 4])])
    with pytest.raises(ShapeError, match="floating-point"):
        make_op(name, axis=0).compute_shape([Shape("int32_type", [2, 3, 4])])
    with pytest.raises(ShapeError, match="scalar"):
        make_op(name, axis=0).compute_shape([Shape("float_type", [])])
    with pytest.raises(ShapeError, match="expected 1 inputs"):
        make_op(name).compute_shape([Shape("float_type", [2, 3])] * 2)


def test_softmax_keeps_strides_out() -> None:
    # a transposed input gives a standard output of the same lens
    s = make_op("softmax", axis=0).compute_shape([Shape("float_type", [3, 4], [1, 3])])
    assert s == Shape("float_type", [3, 4])
