"""Tests of `pygraphx.ir.shape`: type names and dtypes, strides, predicates, sizes, printing.

The expectations follow MIGraphX's `shape` (seed 001): strides in elements, row-major by default,
`elements()` / `bytes()`, and the printed form `float_type, {1, 3, 224, 224}, {150528, ...}`.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from pygraphx.ir.shape import (
    FLOAT_TYPES,
    Shape,
    from_dtype,
    shape_of,
    standard_strides,
    to_dtype,
    type_names,
)

EXPECTED_DTYPES = {
    "bool_type": np.bool_,
    "half_type": np.float16,
    "float_type": np.float32,
    "double_type": np.float64,
    "uint8_type": np.uint8,
    "int8_type": np.int8,
    "uint16_type": np.uint16,
    "int16_type": np.int16,
    "int32_type": np.int32,
    "int64_type": np.int64,
    "uint32_type": np.uint32,
    "uint64_type": np.uint64,
    "bf16_type": ml_dtypes.bfloat16,
    "fp8e4m3fnuz_type": ml_dtypes.float8_e4m3fnuz,
    "fp8e4m3fn_type": ml_dtypes.float8_e4m3fn,
    "fp8e5m2_type": ml_dtypes.float8_e5m2,
    "fp8e5m2fnuz_type": ml_dtypes.float8_e5m2fnuz,
    "int4_type": ml_dtypes.int4,
    "uint4_type": ml_dtypes.uint4,
    "int2_type": ml_dtypes.int2,
    "uint2_type": ml_dtypes.uint2,
    "fp4e2m1_type": ml_dtypes.float4_e2m1fn,
    "fp8e8m0_type": ml_dtypes.float8_e8m0fnu,
    "string_type": np.object_,
}


# --- types ----------------------------------------------------------------------------------
def test_type_names_are_the_expected_set() -> None:
    assert set(type_names()) == set(EXPECTED_DTYPES)
    assert FLOAT_TYPES <= set(type_names())


@pytest.mark.parametrize("name", sorted(EXPECTED_DTYPES))
def test_type_name_round_trips_to_dtype(name: str) -> None:
    dtype = np.dtype(EXPECTED_DTYPES[name])
    assert to_dtype(name) == dtype
    assert from_dtype(dtype) == name
    assert from_dtype(EXPECTED_DTYPES[name]) == name  # a scalar type, not a dtype
    s = Shape(name, [2, 3])
    assert s.type() == s.type_string() == name
    assert s.dtype() == dtype
    assert s.type_size() == dtype.itemsize
    assert Shape(dtype, [2, 3]) == s
    assert shape_of(np.zeros((2, 3), dtype)) == s


def test_sub_byte_float_types_have_one_byte() -> None:
    for name in ("fp8e4m3fnuz_type", "fp8e4m3fn_type", "fp8e5m2_type", "fp8e5m2fnuz_type"):
        assert Shape(name, [4]).bytes() == 4
    assert Shape("bf16_type", [4]).bytes() == 8


def test_unknown_type_and_dtype() -> None:
    with pytest.raises(ValueError, match="unknown shape type 'float32_type'"):
        Shape("float32_type", [1])
    with pytest.raises(ValueError, match="complex64"):
        from_dtype(np.complex64)


# --- construction ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("lens", "strides"),
    [
        ([], []),
        ([5], [1]),
        ([2, 3], [3, 1]),
        ([1, 3, 224, 224], [150528, 50176, 224, 1]),
        ([64, 3, 7, 7], [147, 49, 7, 1]),
        ([2, 0, 3], [3, 3, 1]),  # a zero length does not zero the outer strides
    ],
)
def test_default_strides_are_row_major(lens: list[int], strides: list[int]) -> None:
    assert Shape("float_type", lens).strides() == strides
    assert list(standard_strides(lens)) == strides


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="negative"):
        Shape("float_type", [2, -1])
    with pytest.raises(ValueError, match="different ranks"):
        Shape("float_type", [2, 3], [1])


def test_value_semantics() -> None:
    a = Shape("float_type", [2, 3])
    assert a == Shape("float_type", (2, 3), (3, 1))
    assert hash(a) == hash(Shape("float_type", [2, 3], [3, 1]))
    assert a != Shape("float_type", [2, 3], [1, 2])
    assert a != Shape("half_type", [2, 3])
    assert len({a, Shape("float_type", [2, 3]), Shape("float_type", [3, 2])}) == 2
    lens = a.lens()
    lens.append(9)  # accessors return copies
    assert a.lens() == [2, 3]
    assert a.with_lens([4]) == Shape("float_type", [4])
    assert a.with_type("int8_type") == Shape("int8_type", [2, 3])
    assert Shape("float_type", [2, 3], [1, 2]).as_standard() == a
    assert a.ndim() == 2 and not a.dynamic()


# --- predicates -----------------------------------------------------------------------------
# name: (lens, strides, standard, packed, transposed, broadcasted, scalar)
PREDICATES = {
    "standard": ([2, 3, 4], [12, 4, 1], True, True, False, False, False),
    "standard with unit dims of any stride": (
        [2, 1, 4],
        [4, 99, 1],
        True,
        True,
        False,
        False,
        False,
    ),
    "transposed 2d": ([3, 2], [1, 3], False, True, True, False, False),
    "transposed nchw->nhwc": ([1, 3, 4, 5], [60, 1, 15, 3], False, True, True, False, False),
    "sliced (gaps)": ([2, 2], [3, 1], False, False, False, False, False),
    "strided step": ([3], [2], False, False, False, False, False),
    "broadcast row": ([4, 3], [0, 1], False, False, False, True, False),
    "broadcast column": ([4, 3], [1, 0], False, False, False, True, False),
    "scalar rank 0": ([], [], True, True, False, False, True),
    "scalar broadcast": ([2, 3], [0, 0], False, False, False, True, True),
    "single element": ([1], [1], True, True, False, False, False),
    "single element stride 0": ([1], [0], True, True, False, False, True),
}


@pytest.mark.parametrize("case", sorted(PREDICATES))
def test_predicates(case: str) -> None:
    lens, strides, standard, packed, transposed, broadcasted, scalar = PREDICATES[case]
    s = Shape("float_type", lens, strides)
    assert s.standard() is standard
    assert s.packed() is packed
    assert s.transposed() is transposed
    assert s.broadcasted() is broadcasted
    assert s.scalar() is scalar


def test_predicates_match_numpy_views() -> None:
    base = np.zeros((2, 3, 4), np.float32)
    assert shape_of(base).standard()
    assert shape_of(base.transpose(2, 0, 1)).transposed()
    assert not shape_of(base[:, 1:, :]).packed()
    assert shape_of(np.broadcast_to(base[:, :1, :], (2, 5, 4))).broadcasted()
    with pytest.raises(ValueError, match="negative strides"):
        shape_of(base[::-1])


# --- sizes ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("type_name", "lens", "strides", "elements", "space", "nbytes"),
    [
        ("float_type", [64, 3, 7, 7], None, 9408, 9408, 37632),  # seed 001's example
        ("half_type", [2, 3], None, 6, 6, 12),
        ("double_type", [], None, 1, 1, 8),
        ("float_type", [0, 3], None, 0, 0, 0),
        ("float_type", [2, 2], [3, 1], 4, 5, 20),  # a slice of a 2x3 buffer
        ("int8_type", [3], [2], 3, 5, 5),  # every other element
        ("float_type", [3, 2], [1, 3], 6, 6, 24),  # transposed
        ("float_type", [4, 3], [0, 1], 12, 3, 12),  # broadcast: one row in memory
        ("int64_type", [5, 7], [0, 0], 35, 1, 8),  # broadcast scalar
        ("bool_type", [8], None, 8, 8, 8),
    ],
)
def test_elements_and_bytes(
    type_name: str,
    lens: list[int],
    strides: list[int] | None,
    elements: int,
    space: int,
    nbytes: int,
) -> None:
    s = Shape(type_name, lens, strides)
    assert s.elements() == elements
    assert s.element_space() == space
    assert s.bytes() == nbytes


def test_bytes_match_the_numpy_buffer_of_a_view() -> None:
    base = np.zeros((6, 8), np.float32)
    view = base[1:5:2, 2:7]
    s = shape_of(view)
    assert s.strides() == [16, 1]
    # from the first to the last element of the view, inclusive
    first = view.__array_interface__["data"][0]
    last = view[-1, -1:].__array_interface__["data"][0]
    assert s.bytes() == last - first + 4


# --- printing -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "text"),
    [
        (
            Shape("float_type", [1, 3, 224, 224]),
            "float_type, {1, 3, 224, 224}, {150528, 50176, 224, 1}",
        ),
        (Shape("float_type", [1, 1000]), "float_type, {1, 1000}, {1000, 1}"),
        (Shape("float_type", []), "float_type, {}, {}"),
        (Shape("half_type", [2, 3], [0, 1]), "half_type, {2, 3}, {0, 1}"),
        (Shape("bf16_type", [4]), "bf16_type, {4}, {1}"),
        (Shape("fp8e4m3fnuz_type", [2, 2], [1, 2]), "fp8e4m3fnuz_type, {2, 2}, {1, 2}"),
    ],
)
def test_printing(shape: Shape, text: str) -> None:
    assert str(shape) == text
    assert repr(shape) == f"Shape({shape.type()!r}, {shape.lens()}, {shape.strides()})"
