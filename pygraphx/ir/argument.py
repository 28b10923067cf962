"""Arguments (tensor values) and literals (immutable constant values).

An `Argument` is a shape plus a buffer. It wraps a numpy array, so views made by broadcast, slice,
transpose and reshape share memory with the array they come from, exactly as MIGraphX's arguments
do; `contiguous()` makes a packed copy. A `Literal` is an argument whose buffer is read-only: the
weights and constants of a program.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygraphx.ir.shape import Shape, shape_of, to_dtype


def _as_array(data: Any, shape: Shape | None) -> np.ndarray:
    if isinstance(data, Argument):
        data = data.array
    if shape is None:
        arr = np.asarray(data)
        if any(s < 0 for s in arr.strides):
            arr = np.asarray(arr, order="C")
        return arr
    dtype = shape.dtype()
    arr = np.asarray(data)
    if arr.dtype != dtype:
        raise TypeError(f"data of dtype {arr.dtype} does not match shape type {shape.type()}")
    if arr.size != shape.elements():
        raise ValueError(f"data has {arr.size} elements but shape {shape} needs {shape.elements()}")
    arr = np.asarray(arr, order="C").reshape(shape.lens())
    if not shape.standard():
        itemsize = dtype.itemsize
        base = np.empty(shape.element_space(), dtype)
        view = np.lib.stride_tricks.as_strided(
            base, shape.lens(), [s * itemsize for s in shape.strides()]
        )
        view[...] = arr
        arr = view
    return arr


class Argument:
    """A tensor value: `get_shape()` and a numpy buffer (`np.array(arg)` converts it)."""

    __slots__ = ("array",)

    def __init__(self, data: Any = None, shape: Shape | None = None) -> None:
        if data is None:
            if shape is None:
                raise ValueError("argument needs data or a shape")
            data = np.zeros(shape.lens(), shape.dtype())
        self.array: np.ndarray = _as_array(data, shape)

    def get_shape(self) -> Shape:
        return shape_of(self.array)

    def data(self) -> np.ndarray:
        return self.array

    def contiguous(self) -> Argument:
        return Argument(np.asarray(self.array, order="C"))

    def tolist(self) -> list:
        return self.array.tolist()

    def empty(self) -> bool:
        return self.array.size == 0

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.array
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        if copy:
            return arr.copy()
        return arr

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Argument):
            return NotImplemented
        return self.array.dtype == other.array.dtype and np.array_equal(self.array, other.array)

    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        return format_values(self.array)

    def __repr__(self) -> str:
        return f"argument({self.get_shape()})"


class Literal(Argument):
    """An immutable argument: the value of a `@literal` instruction."""

    __slots__ = ()

    def __init__(self, data: Any, shape: Shape | None = None, *, copy: bool = True) -> None:
        super().__init__(data, shape)
        arr = self.array
        if copy or not arr.flags.c_contiguous:
            arr = np.array(arr, copy=True, order="C")
        arr.flags.writeable = False
        self.array = arr


class RoundedLiteral(Literal):
    """A literal whose value was rounded (to bf16 / half) from `wide`, a float32 array of the same
    shape kept beside it: the program computes with the rounded value; a kernel that adds a
    product's bias in float32 may read the unrounded one (`pygraphx.quantize.wide_constants`,
    `pygraphx.ops.literal_views.wide_vector`). Saved and loaded with its program."""

    __slots__ = ("wide",)

    def __init__(self, low: Any, wide: np.ndarray) -> None:
        super().__init__(low, copy=False)
        if wide.shape != self.array.shape:
            raise ValueError(f"wide value of shape {wide.shape} for a literal {self.array.shape}")
        wide = np.array(wide, dtype=np.float32, order="C")
        wide.flags.writeable = False
        self.wide = wide


def format_values(arr: np.ndarray, limit: int | None = None) -> str:
    """Values as MIGraphX prints them: comma separated, with `...` in the middle past `limit`."""
    flat = np.asarray(arr).reshape(-1)
    if limit is not None and flat.size > 2 * limit:
        head = ", ".join(_fmt(v) for v in flat[:limit])
        tail = ", ".join(_fmt(v) for v in flat[-limit:])
        return f"{head}, ..., {tail}"
    return ", ".join(_fmt(v) for v in flat)


def _fmt(v: Any) -> str:
    if isinstance(v, np.bool_ | bool):
        return "1" if v else "0"
    if isinstance(v, np.integer | int):
        return str(int(v))
    return f"{float(v):g}"


def generate_argument(shape: Shape, seed: int = 0) -> Argument:
    """A deterministic random argument of `shape` (floats in [-1, 1), integers in [0, 8); the
    unsigned e8m0 scale type in [0.25, 1); strings: decimals in [-1, 1))."""
    rng = np.random.default_rng(seed)
    dtype = to_dtype(shape.type())
    lens = shape.lens()
    if dtype == np.bool_:
        data = rng.integers(0, 2, lens).astype(np.bool_)
    elif np.issubdtype(dtype, np.integer):
        data = rng.integers(0, 8, lens).astype(dtype)
    elif shape.type() == "string_type":  # decimal strings of floats in [-1, 1)
        data = np.round(rng.uniform(-1.0, 1.0, lens), 3).astype(str).astype(object)
    elif shape.type() == "fp8e8m0_type":  # powers of two only, no sign, no zero
        data = rng.uniform(0.25, 1.0, lens).astype(dtype)
    else:  # drawn in float32 (float64 for double), never a float64 copy of a float32 input
        data = rng.random(lens, dtype=np.float64 if dtype == np.float64 else np.float32)
        data *= 2
        data -= 1
        data = data.astype(dtype, copy=False)
    return Argument(data, shape)


def generate_literal(shape: Shape, seed: int = 0) -> Literal:
    """A deterministic random literal of `shape`."""
    return Literal(generate_argument(shape, seed).array)
