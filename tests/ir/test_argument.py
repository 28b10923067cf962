"""Tests of `pygraphx.ir.argument`: arguments as (possibly strided) numpy views, read-only
literals, value printing, and the seeded `generate_argument` / `generate_literal`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from pygraphx.ir.argument import (
    Argument,
    Literal,
    format_values,
    generate_argument,
    generate_literal,
)
from pygraphx.ir.shape import Shape, type_names


# --- arguments and views ----------------------------------------------------------------------
def test_argument_wraps_without_copying() -> None:
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    arg = Argument(base)
    assert arg.get_shape() == Shape("float_type", [3, 4])
    assert np.shares_memory(np.asarray(arg), base)
    base[0, 0] = 42.0
    assert np.asarray(arg)[0, 0] == 42.0
    assert arg.data() is arg.array


@pytest.mark.parametrize(
    ("make_view", "strides", "predicate"),
    [
        (lambda b: b.T, [1, 4], "transposed"),
        (lambda b: b[:, 1:3], [4, 1], None),
        (lambda b: b[::2], [8, 1], None),
        (lambda b: np.broadcast_to(b[:1], (5, 4)), [0, 1], "broadcasted"),
        (lambda b: b.reshape(2, 6), [6, 1], "standard"),
    ],
)
def test_views_share_memory(
    make_view: Callable[[np.ndarray], np.ndarray], strides: list[int], predicate: str | None
) -> None:
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = make_view(base)
    arg = Argument(view)
    shape = arg.get_shape()
    assert shape.lens() == list(view.shape)
    assert shape.strides() == strides
    if predicate is not None:
        assert getattr(shape, predicate)()
    assert np.shares_memory(np.asarray(arg), base)
    np.testing.assert_array_equal(np.array(arg), view)


def test_contiguous_copies() -> None:
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    arg = Argument(base.T)
    packed = arg.contiguous()
    assert packed.get_shape() == Shape("float_type", [4, 3])
    assert packed.get_shape().standard()
    assert not np.shares_memory(np.asarray(packed), base)
    np.testing.assert_array_equal(np.asarray(packed), base.T)


def test_negative_strides_are_copied() -> None:
    base = np.arange(6, dtype=np.int32)
    arg = Argument(base[::-1])
    assert arg.get_shape() == Shape("int32_type", [6])
    np.testing.assert_array_equal(np.asarray(arg), [5, 4, 3, 2, 1, 0])


def test_np_array_conversion() -> None:
    base = np.arange(6, dtype=np.float32)
    arg = Argument(base)
    copied = np.array(arg)
    assert copied.dtype == np.float32
    np.testing.assert_array_equal(copied, base)
    assert not np.shares_memory(copied, base)
    assert not np.shares_memory(np.array(arg, copy=True), base)
    as_double = np.asarray(arg, dtype=np.float64)
    assert as_double.dtype == np.float64
    np.testing.assert_array_equal(as_double, base)
    assert arg.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_argument_with_a_strided_shape() -> None:
    shape = Shape("float_type", [2, 3], [1, 2])  # column-major
    data = np.arange(6, dtype=np.float32)
    arg = Argument(data, shape)
    assert arg.get_shape() == shape
    np.testing.assert_array_equal(np.asarray(arg), data.reshape(2, 3))


def test_argument_from_shape_is_zeros() -> None:
    arg = Argument(shape=Shape("half_type", [2, 2]))
    assert arg.get_shape() == Shape("half_type", [2, 2])
    assert not np.asarray(arg).any()
    assert Argument(shape=Shape("float_type", [0])).empty()
    with pytest.raises(ValueError, match="data or a shape"):
        Argument()


def test_argument_checks_data_against_shape() -> None:
    with pytest.raises(TypeError, match="float64 does not match shape type float_type"):
        Argument(np.zeros(3), Shape("float_type", [3]))
    with pytest.raises(ValueError, match="has 4 elements"):
        Argument(np.zeros(4, np.float32), Shape("float_type", [3]))


def test_equality_and_printing() -> None:
    a = Argument(np.array([1.0, 2.5, -3.0], np.float32))
    assert a == Argument(np.array([1.0, 2.5, -3.0], np.float32))
    assert a != Argument(np.array([1.0, 2.5, -3.0], np.float64))
    assert a != Argument(np.array([1.0, 2.5, 3.0], np.float32))
    assert str(a) == "1, 2.5, -3"
    assert repr(a) == "argument(float_type, {3}, {1})"
    assert str(Argument(np.array([True, False]))) == "1, 0"


def test_format_values_elides_the_middle() -> None:
    arr = np.arange(12, dtype=np.int64)
    assert format_values(arr) == ", ".join(str(v) for v in range(12))
    assert format_values(arr, 5) == "0, 1, 2, 3, 4, ..., 7, 8, 9, 10, 11"
    assert format_values(arr[:10], 5) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9"


# --- literals -------------------------------------------------------------------------------
def test_literal_is_read_only_and_copied() -> None:
    data = np.arange(4, dtype=np.float32)
    lit = Literal(data)
    assert isinstance(lit, Argument)
    with pytest.raises(ValueError, match="read-only"):
        np.asarray(lit)[0] = 1.0
    data[0] = 99.0  # the literal owns a copy
    assert np.asarray(lit)[0] == 0.0
    assert data.flags.writeable


def test_literal_of_a_view_is_packed() -> None:
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    lit = Literal(base.T, copy=False)  # a non-contiguous view is copied anyway
    assert lit.get_shape().standard()
    assert not np.shares_memory(np.asarray(lit), base)
    np.testing.assert_array_equal(np.asarray(lit), base.T)


def test_literal_with_shape() -> None:
    lit = Literal(np.array([1, 2, 3, 4], np.int32), Shape("int32_type", [2, 2]))
    assert lit.get_shape() == Shape("int32_type", [2, 2])
    assert lit.tolist() == [[1, 2], [3, 4]]


# --- generated values -----------------------------------------------------------------------
@pytest.mark.parametrize("type_name", type_names())
def test_generate_argument_is_deterministic(type_name: str) -> None:
    shape = Shape(type_name, [4, 8])
    a = generate_argument(shape, seed=7)
    b = generate_argument(shape, seed=7)
    assert a.get_shape() == shape
    if type_name == "string_type":  # object arrays: compare the strings, not the pointers
        assert np.asarray(a).tolist() == np.asarray(b).tolist()
    else:
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    values = np.asarray(a).astype(np.float64)
    if type_name == "bool_type":
        assert set(np.unique(values)) <= {0.0, 1.0}
    elif shape.dtype().kind in "iu":
        assert values.min() >= 0 and values.max() < 8
    else:
        assert values.min() >= -1.0 and values.max() <= 1.0


def test_generate_argument_depends_on_seed() -> None:
    shape = Shape("float_type", [16])
    a, b = generate_argument(shape, 0), generate_argument(shape, 1)
    assert not np.array_equal(np.asarray(a), np.asarray(b))
    assert generate_argument(shape) == a  # seed 0 by default


def test_generate_literal() -> None:
    shape = Shape("half_type", [3, 3])
    lit = generate_literal(shape, seed=5)
    assert isinstance(lit, Literal)
    assert lit.get_shape() == shape
    assert not np.asarray(lit).flags.writeable
    np.testing.assert_array_equal(np.asarray(lit), np.asarray(generate_argument(shape, 5)))


def test_generate_argument_keeps_strides() -> None:
    shape = Shape("float_type", [2, 3], [1, 2])
    assert generate_argument(shape, seed=1).get_shape() == shape
