"""IR layout and indexing operators: views really share memory and their compute_shape strides
match the numpy views; copies are right; ShapeError messages name the problem."""

from __future__ import annotations

import numpy as np
import pytest

from pygraphx.ir.module import Module
from pygraphx.ir.program import Program
from pygraphx.ir.shape import Shape, from_dtype, shape_of
from pygraphx.ops import ShapeError, make_op
from pygraphx.ops.indexing import interpolation_weights, nearest_index, source_coordinates
from pygraphx.ops.layout import reshape_lens, slice_ranges
from pygraphx.targets import get_target

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def shape_of_array(a: np.ndarray) -> Shape:
    return shape_of(a) if all(s >= 0 for s in a.strides) else Shape(from_dtype(a.dtype), a.shape)


def run(op, *arrays: np.ndarray) -> tuple[np.ndarray, Shape]:
    """compute_shape on the arrays' real shapes (strides included), then compute."""
    out_shape = op.compute_shape([shape_of_array(a) for a in arrays])
    out = np.asarray(op.compute(out_shape, list(arrays)))
    assert list(out.shape) == out_shape.lens()
    assert out.dtype == out_shape.dtype()
    return out, out_shape


def meaningful_strides(s: Shape) -> list[tuple[int, int]]:
    """(axis, stride) of the dimensions longer than 1 (a length-1 stride is never used)."""
    return [(k, st) for k, (n, st) in enumerate(zip(s.lens(), s.strides(), strict=True)) if n > 1]


def assert_view(op, x: np.ndarray) -> np.ndarray:
    out, s = run(op, x)
    assert op.output_alias(1) == 0
    assert np.shares_memory(out, x), f"{op} copied its input"
    assert meaningful_strides(s) == meaningful_strides(shape_of(out)), (s, shape_of(out))
    return out


# --- views ------------------------------------------------------------------------------------

TRANSPOSED = np.ascontiguousarray(X.transpose(2, 0, 1)).transpose(
    1, 2, 0
)  # standard lens, odd strides


@pytest.mark.parametrize("x", [X, TRANSPOSED], ids=["standard", "transposed"])
@pytest.mark.parametrize(
    ("name", "attrs", "want"),
    [
        ("transpose", {"permutation": (2, 0, 1)}, lambda x: x.transpose(2, 0, 1)),
        ("transpose", {"permutation": (0, 1, 2)}, lambda x: x),
        ("slice", {"axes": (1, 2), "starts": (1, -3), "ends": (3, 100)}, lambda x: x[:, 1:3, 1:]),
        ("slice", {"axes": (0,), "starts": (-100,), "ends": (-1,)}, lambda x: x[:1]),
        ("step", {"axes": (2, 1), "steps": (2, 3)}, lambda x: x[:, ::3, ::2]),
        ("unsqueeze", {"axes": (0, 2)}, lambda x: x[None, :, None]),
        ("unsqueeze", {"axes": (-1,)}, lambda x: x[..., None]),
    ],
)  # fmt: skip
def test_view_ops_share_memory_and_strides(x, name, attrs, want) -> None:
    out = assert_view(make_op(name, **attrs), x)
    np.testing.assert_array_equal(out, want(x))


def test_squeeze_is_a_view() -> None:
    x = RNG.standard_normal((1, 3, 1, 4)).astype(np.float32)
    out = assert_view(make_op("squeeze", axes=(0, -2)), x)
    assert out.shape == (3, 4)
    out = assert_view(make_op("squeeze"), x[:, :, :, 1:3])
    np.testing.assert_array_equal(out, x[0, :, 0, 1:3])


@pytest.mark.parametrize(("name", "attrs"), [("reshape", {"dims": (4, -1)}), ("flatten", {})])
def test_reshape_of_standard_input_is_a_view(name: str, attrs: dict) -> None:
    out = assert_view(make_op(name, **attrs), X)
    assert out.shape == ((4, 6) if name == "reshape" else (2, 12))
    sliced = X[1:]  # an offset view is still standard
    assert np.shares_memory(run(make_op(name, **attrs), sliced)[0], sliced)


@pytest.mark.parametrize(("name", "attrs"), [("reshape", {"dims": (0, -1)}), ("flatten", {})])
def test_reshape_of_non_standard_input_copies(name: str, attrs: dict) -> None:
    t = X.transpose(0, 2, 1)
    out, s = run(make_op(name, **attrs), t)
    assert s.standard() and out.flags.c_contiguous
    np.testing.assert_array_equal(out, np.ascontiguousarray(t).reshape(2, 12))
    b = np.broadcast_to(X[:, :1], (2, 3, 4))
    out, s = run(make_op("reshape", dims=(6, 4)), b)
    np.testing.assert_array_equal(out, np.ascontiguousarray(b).reshape(6, 4))


def test_views_in_a_program_alias_the_parameter() -> None:
    prog = Program()
    m: Module = prog.get_main_module()
    x = m.add_parameter("x", Shape("float_type", [2, 3, 4]))
    t = m.add_instruction(make_op("transpose", permutation=(1, 0, 2)), [x])
    s = m.add_instruction(make_op("slice", axes=(2,), starts=(1,), ends=(3,)), [t])
    m.add_return([s])
    assert s.shape == Shape("float_type", [3, 2, 2], [4, 12, 1])
    prog.compile(get_target("ref"))
    out = prog.run({"x": X})[0]
    np.testing.assert_array_equal(np.asarray(out), X.transpose(1, 0, 2)[:, :, 1:3])


# --- copies -----------------------------------------------------------------------------------


def test_concat_and_reverse() -> None:
    y = RNG.standard_normal((2, 1, 4)).astype(np.float32)
    out, s = run(make_op("concat", axis=-2), X, y, X.transpose(0, 1, 2))
    np.testing.assert_array_equal(out, np.concatenate([X, y, X], axis=1))
    assert s.lens() == [2, 7, 4] and s.standard()
    out, s = run(make_op("reverse", axes=(0, 2)), X)
    np.testing.assert_array_equal(out, X[::-1, :, ::-1])
    assert s.standard() and not np.shares_memory(out, X)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes_match_numpy(mode: str) -> None:
    pads = (0, 1, 2, 1, 2, 3)
    out, _ = run(make_op("pad", pads=pads, mode=mode, value=1.5), X)
    widths = [(0, 1), (1, 2), (2, 3)]
    kwargs = {"constant_values": 1.5} if mode == "constant" else {}
    np.testing.assert_array_equal(out, np.pad(X, widths, mode=mode, **kwargs))


def test_pad_integer_value_keeps_type() -> None:
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    out, _ = run(make_op("pad", pads=(1, 0, 0, 1), value=-7), x)
    assert out.dtype == np.int64 and out[0, 0] == -7 and out[2, 3] == -7


def test_gather_family() -> None:
    idx = np.array([[0, -1], [2, 1]], np.int64)
    out, s = run(make_op("gather", axis=1), X, idx)
    np.testing.assert_array_equal(out, np.take(X, [[0, 2], [2, 1]], axis=1))
    assert s.lens() == [2, 2, 2, 4]
    out, _ = run(make_op("gather", axis=0), X, np.array(-1, np.int32))
    np.testing.assert_array_equal(out, X[-1])
    ge = np.array([[[0, 1, -1, 2]], [[2, 2, 0, 0]]], np.int64)
    out, _ = run(make_op("gather_elements", axis=1), X, ge)
    np.testing.assert_array_equal(out, np.take_along_axis(X, ge % 3, axis=1))
    nd = np.array([[1, 2], [0, -1]], np.int64)
    out, _ = run(make_op("gathernd"), X, nd)
    np.testing.assert_array_equal(out, np.stack([X[1, 2], X[0, 2]]))
    out, _ = run(make_op("gathernd", batch_dims=1), X, np.array([[1], [2]], np.int64))
    np.testing.assert_array_equal(out, np.stack([X[0, 1], X[1, 2]]))


def test_gather_index_out_of_range_is_an_error() -> None:
    with pytest.raises(IndexError, match="index 3 is out of range for a dimension of 3"):
        run(make_op("gather", axis=1), X, np.array([3], np.int64))


@pytest.mark.parametrize(
    ("reduction", "fn"),
    [("none", None), ("add", np.add), ("mul", np.multiply), ("max", np.maximum),
     ("min", np.minimum)],
)  # fmt: skip
def test_scatter_elements_reductions(reduction: str, fn) -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    idx = np.array([[2, 0], [1, -2]], np.int64)
    upd = np.array([[10, 20], [30, 40]], np.float32)
    out, _ = run(make_op("scatter_elements", axis=1, reduction=reduction), data, idx, upd)
    want = data.copy()
    for i in range(2):
        for j in range(2):
            k = idx[i, j] % 3
            want[i, k] = upd[i, j] if fn is None else fn(want[i, k], upd[i, j])
    np.testing.assert_array_equal(out, want)
    assert not np.shares_memory(out, data)


def test_scatternd_with_duplicates_accumulates() -> None:
    data = np.zeros((3, 2), np.int32)
    idx = np.array([[0], [2], [0]], np.int64)
    upd = np.array([[1, 2], [3, 4], [5, 6]], np.int32)
    out, _ = run(make_op("scatternd", reduction="add"), data, idx, upd)
    np.testing.assert_array_equal(out, [[6, 8], [0, 0], [3, 4]])


# --- resize -----------------------------------------------------------------------------------


def test_resize_nearest_and_linear_identities() -> None:
    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    up = make_op("resize", sizes=(1, 1, 6, 8), scales=(1.0, 1.0, 2.0, 2.0), mode="nearest",
                 coordinate_transformation_mode="asymmetric", nearest_mode="floor")  # fmt: skip
    out, _ = run(up, x)
    np.testing.assert_array_equal(out, x.repeat(2, axis=2).repeat(2, axis=3))
    lin = make_op("resize", sizes=(1, 1, 5, 7), scales=(1.0, 1.0, 5 / 3, 7 / 4), mode="linear",
                  coordinate_transformation_mode="align_corners")  # fmt: skip
    out, _ = run(lin, x)
    # linear on a linear ramp with align_corners reproduces the ramp
    rows = np.linspace(0, 2, 5)[:, None] * 4 + np.linspace(0, 3, 7)[None, :]
    np.testing.assert_allclose(out[0, 0], rows, rtol=1e-6)


def test_resize_weights_sum_to_one_and_exclude_outside() -> None:
    coords = source_coordinates("half_pixel", 7, 4, 7 / 4)
    for mode in ("linear", "cubic"):
        w = interpolation_weights(coords, 4, mode, 7 / 4)
        np.testing.assert_allclose(w.sum(axis=1), 1.0)
    w = interpolation_weights(np.array([-0.3]), 4, "cubic", 2.0, -0.5, exclude_outside=True)
    np.testing.assert_allclose(w.sum(), 1.0)
    assert nearest_index(np.array([0.5, 1.5, 2.5]), "round_prefer_floor", 3).tolist() == [0, 1, 2]
    assert nearest_index(np.array([0.5, 1.5]), "round_prefer_ceil", 3).tolist() == [1, 2]


# --- shape rules and errors ---------------------------------------------------------------------


def test_shape_rules() -> None:
    assert reshape_lens([2, 3, 4], [0, -1]) == [2, 12]
    assert reshape_lens([0, 3, 4], [3, 4, 0], allowzero=True) == [3, 4, 0]
    assert slice_ranges([10], [-1], [-100], None, [-2]) == [(9, -1, -2)]
    assert slice_ranges([10, 5], [2], [1000], [1]) == [(0, 10, 1), (2, 5, 1)]


@pytest.mark.parametrize(
    ("op", "inputs", "match"),
    [
        (make_op("transpose", permutation=(0, 0, 1)), [[2, 3, 4]], "not a permutation"),
        (make_op("reshape", dims=(5, -1)), [[2, 3, 4]], "cannot infer the -1"),
        (make_op("reshape", dims=(-1, -1)), [[2, 3, 4]], "more than one -1"),
        (make_op("reshape", dims=(5, 5)), [[2, 3, 4]], r"do not fit lens \[2, 3, 4\]"),
        (make_op("squeeze", axes=(1,)), [[2, 3, 4]], "axis 1 of input lens"),
        (make_op("unsqueeze", axes=(4,)), [[2, 3, 4]], "axis 4 is out of range for rank 4"),
        (make_op("flatten", axis=4), [[2, 3, 4]], "out of range"),
        (make_op("concat", axis=0), [[2, 3, 4], [2, 4, 4]], "differ outside axis 0"),
        (make_op("slice", axes=(0, 1), starts=(0,), ends=(1, 1)), [[2, 3]], "differ in length"),
        (make_op("step", axes=(0,), steps=(0,)), [[2, 3]], "must be positive"),
        (make_op("pad", pads=(1, 1)), [[2, 3]], "2 \\* rank = 4"),
        (make_op("pad", pads=(0, 0, 0, 0), mode="mirror"), [[2, 3]], "unknown mode"),
        (make_op("resize", sizes=(2,), scales=(1.0,), mode="area"), [[2]], "unknown mode"),
        (make_op("resize", sizes=(2, 2), scales=(1.0,)), [[2, 2]], "one value per dimension"),
    ],
)  # fmt: skip
def test_shape_errors(op, inputs, match) -> None:
    with pytest.raises(ShapeError, match=match):
        op.compute_shape([Shape("float_type", lens) for lens in inputs])


def test_index_and_scatter_shape_errors() -> None:
    f, i64 = Shape("float_type", [2, 3]), Shape("int64_type", [2, 2])
    with pytest.raises(ShapeError, match="indices must be int32_type or int64_type"):
        make_op("gather").compute_shape([f, Shape("float_type", [2])])
    with pytest.raises(ShapeError, match="updates lens"):
        make_op("scatter_elements").compute_shape([f, i64, Shape("float_type", [2, 3])])
    with pytest.raises(ShapeError, match="updates lens .* must be"):
        make_op("scatternd").compute_shape(
            [f, Shape("int64_type", [2, 1]), i64.with_type("float_type")]
        )
    with pytest.raises(ShapeError, match="unknown reduction"):
        make_op("scatternd", reduction="sum").compute_shape([f, i64, Shape("float_type", [2])])
    with pytest.raises(ShapeError, match="batch_dims 2"):
        make_op("gathernd", batch_dims=2).compute_shape([f, i64])


# --- run-time shape parameters -------------------------------------------------------------------


def test_shape_guard_passes_and_rejects() -> None:
    op = make_op("shape_guard", rule="reshape", expected=(6, 4))
    out, _ = run(op, X, np.array([-1, 4], np.int64))
    assert out is X
    with pytest.raises(ValueError, match=r"gives \[4, 6\], but the program was compiled for"):
        run(op, X, np.array([4, -1], np.int64))


def test_dynamic_slice_and_pad() -> None:
    op = make_op("dynamic_slice", out_lens=(2, 3, 2))
    args = [np.array(v, np.int64) for v in ([3, -1], [0, -100], [2, 1], [-2, -1])]
    out, _ = run(op, X, *args)
    np.testing.assert_array_equal(out, X[:, ::-1, 3:0:-2])
    op = make_op("dynamic_pad", mode="edge", out_lens=(2, 3, 7))
    out, _ = run(op, X, np.array([0, 0, 1, 0, 0, 2], np.int64), np.zeros(1, np.float32))
    np.testing.assert_array_equal(out, np.pad(X, [(0, 0), (0, 0), (1, 2)], mode="edge"))
