"""Shapes: element type, lengths and strides of a tensor (the IR's type system).

Every instruction in a module carries the `Shape` of its output. Strides are counted in elements,
as in MIGraphX, so a view (broadcast, slice, transpose) is described by its shape alone. Types are
named as MIGraphX names them (`float_type`, `half_type`, ...) and map to numpy dtypes, with
`ml_dtypes` providing bf16 and the fp8 types.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import prod

import ml_dtypes
import numpy as np

# MIGraphX type name -> numpy dtype. Order is the printing/serialisation order.
_TYPES: dict[str, np.dtype] = {
    "bool_type": np.dtype(np.bool_),
    "half_type": np.dtype(np.float16),
    "float_type": np.dtype(np.float32),
    "double_type": np.dtype(np.float64),
    "uint8_type": np.dtype(np.uint8),
    "int8_type": np.dtype(np.int8),
    "uint16_type": np.dtype(np.uint16),
    "int16_type": np.dtype(np.int16),
    "int32_type": np.dtype(np.int32),
    "int64_type": np.dtype(np.int64),
    "uint32_type": np.dtype(np.uint32),
    "uint64_type": np.dtype(np.uint64),
    "bf16_type": np.dtype(ml_dtypes.bfloat16),
    "fp8e4m3fnuz_type": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "fp8e4m3fn_type": np.dtype(ml_dtypes.float8_e4m3fn),
    "fp8e5m2_type": np.dtype(ml_dtypes.float8_e5m2),
    "fp8e5m2fnuz_type": np.dtype(ml_dtypes.float8_e5m2fnuz),
    # ONNX's sub-byte and scale types (one element per byte in memory, as ml_dtypes holds them)
    "int4_type": np.dtype(ml_dtypes.int4),
    "uint4_type": np.dtype(ml_dtypes.uint4),
    "int2_type": np.dtype(ml_dtypes.int2),
    "uint2_type": np.dtype(ml_dtypes.uint2),
    "fp4e2m1_type": np.dtype(ml_dtypes.float4_e2m1fn),
    "fp8e8m0_type": np.dtype(ml_dtypes.float8_e8m0fnu),
    # ONNX STRING tensors: numpy object arrays of Python str (the reference target only)
    "string_type": np.dtype(object),
}
_DTYPE_TO_TYPE: dict[np.dtype, str] = {v: k for k, v in _TYPES.items()}

#: the most dimensions a shape may have (numpy's own limit; ONNX sets none, and a fuzzed model
#: with a million-element Reshape target must be refused, not multiplied out)
MAX_RANK = 64

FLOAT_TYPES = frozenset(
    [
        "half_type",
        "float_type",
        "double_type",
        "bf16_type",
        "fp8e4m3fnuz_type",
        "fp8e4m3fn_type",
        "fp8e5m2_type",
        "fp8e5m2fnuz_type",
        "fp4e2m1_type",
        "fp8e8m0_type",
    ]
)


def type_names() -> list[str]:
    """All element type names, as MIGraphX spells them."""
    return list(_TYPES)


def to_dtype(type_name: str) -> np.dtype:
    """The numpy dtype of a MIGraphX type name such as `float_type`."""
    try:
        return _TYPES[type_name]
    except KeyError:
        raise ValueError(f"unknown shape type {type_name!r}; known: {', '.join(_TYPES)}") from None


def from_dtype(dtype: np.dtype | type) -> str:
    """The MIGraphX type name of a numpy dtype."""
    dt = np.dtype(dtype)
    try:
        return _DTYPE_TO_TYPE[dt]
    except KeyError:
        raise ValueError(f"numpy dtype {dt} has no pygraphx shape type") from None


@dataclass(frozen=True)
class DynamicDimension:
    """A dimension known only as a range `[min, max]`, with `optimals` the sizes to tune for."""

    min: int
    max: int
    optimals: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.max:
            raise ValueError(f"dynamic dimension needs 0 <= min <= max, got {self.min}, {self.max}")
        if any(not self.min <= o <= self.max for o in self.optimals):
            raise ValueError(f"optimals {list(self.optimals)} outside [{self.min}, {self.max}]")

    def is_fixed(self) -> bool:
        return self.min == self.max

    def __contains__(self, n: object) -> bool:
        return isinstance(n, int) and self.min <= n <= self.max

    def __str__(self) -> str:
        if self.optimals:
            opts = ", ".join(str(o) for o in self.optimals)
            return f"{{{self.min}, {self.max}, {{{opts}}}}}"
        return f"{{{self.min}, {self.max}}}"


def standard_strides(lens: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides (in elements) for `lens`."""
    strides = [1] * len(lens)
    for i in range(len(lens) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(int(lens[i + 1]), 1)
    return tuple(strides)


class Shape:
    """Element type, lengths and strides (in elements) of a tensor.

    `Shape("float_type", [1, 3, 224, 224])` gets row-major strides; pass `strides` for a view.
    Methods mirror MIGraphX's Python API: `lens()`, `strides()`, `type()`, `elements()`, ...
    """

    __slots__ = ("_type", "_lens", "_strides", "_dyn", "_hash")

    def __init__(
        self,
        type: str | np.dtype = "float_type",  # noqa: A002 - MIGraphX's keyword name
        lens: Iterable[int] = (),
        strides: Iterable[int] | None = None,
        dyn_dims: Iterable[DynamicDimension] | None = None,
    ) -> None:
        if not isinstance(type, str):
            type = from_dtype(type)  # noqa: A001
        to_dtype(type)
        self._type = type
        self._dyn: tuple[DynamicDimension, ...] | None = None
        if dyn_dims is not None:
            self._dyn = tuple(dyn_dims)
            lens = [d.max for d in self._dyn]
        self._lens = tuple(map(int, lens))
        if len(self._lens) > MAX_RANK:
            raise ValueError(f"a shape of rank {len(self._lens)}: at most {MAX_RANK} are supported")
        if self._lens and min(self._lens) < 0:
            raise ValueError(f"negative length in shape lens {list(self._lens)}")
        if strides is None:
            self._strides = standard_strides(self._lens)
        else:
            self._strides = tuple(map(int, strides))
            if len(self._strides) != len(self._lens):
                raise ValueError(
                    f"shape lens {list(self._lens)} and strides {list(self._strides)} "
                    "have different ranks"
                )
        self._hash: int | None = None

    # --- MIGraphX-style accessors -------------------------------------------------------
    def type(self) -> str:
        return self._type

    def type_string(self) -> str:
        return self._type

    def lens(self) -> list[int]:
        return list(self._lens)

    def strides(self) -> list[int]:
        return list(self._strides)

    def ndim(self) -> int:
        return len(self._lens)

    def dtype(self) -> np.dtype:
        return _TYPES[self._type]

    def type_size(self) -> int:
        return _TYPES[self._type].itemsize

    def elements(self) -> int:
        return prod(self._lens)

    def element_space(self) -> int:
        """Number of elements the underlying buffer must hold (covers strided views)."""
        if self.elements() == 0:
            return 0
        return 1 + sum((n - 1) * s for n, s in zip(self._lens, self._strides, strict=True))

    def bytes(self) -> int:
        return self.element_space() * self.type_size()

    def packed(self) -> bool:
        """No gaps and no overlaps: the buffer holds exactly `elements()` values."""
        return self.element_space() == self.elements() and not self.broadcasted()

    def standard(self) -> bool:
        """Packed and row-major (dimensions of length 1 may have any stride)."""
        expected = standard_strides(self._lens)
        return all(
            n == 1 or s == e for n, s, e in zip(self._lens, self._strides, expected, strict=True)
        )

    def transposed(self) -> bool:
        """Packed but not row-major."""
        if self.broadcasted() or self.standard():
            return False
        nontrivial = [s for n, s in zip(self._lens, self._strides, strict=True) if n != 1]
        return nontrivial != sorted(nontrivial, reverse=True) and self.packed()

    def broadcasted(self) -> bool:
        return any(s == 0 and n != 1 for n, s in zip(self._lens, self._strides, strict=True))

    def scalar(self) -> bool:
        """A single value (possibly broadcast to every position)."""
        return len(self._lens) == 0 or all(s == 0 for s in self._strides)

    def dynamic(self) -> bool:
        """True when some dimensions are ranges (`lens()` then gives the maximum lens)."""
        return self._dyn is not None

    def dyn_dims(self) -> list[DynamicDimension]:
        if self._dyn is None:
            return [DynamicDimension(n, n) for n in self._lens]
        return list(self._dyn)

    def min_lens(self) -> list[int]:
        return [d.min for d in self.dyn_dims()]

    def max_lens(self) -> list[int]:
        return [d.max for d in self.dyn_dims()]

    def accepts(self, lens: Iterable[int]) -> bool:
        """Whether concrete `lens` fit this (possibly dynamic) shape."""
        lens = list(lens)
        dims = self.dyn_dims()
        return len(lens) == len(dims) and all(n in d for n, d in zip(lens, dims, strict=True))

    def with_lens(self, lens: Iterable[int]) -> Shape:
        """Same type, new lens, standard strides."""
        return Shape(self._type, lens)

    def with_type(self, type_name: str) -> Shape:
        return Shape(type_name, self._lens, self._strides)

    def as_standard(self) -> Shape:
        return Shape(self._type, self._lens)

    # --- value semantics ---------------------------------------------------------------
    def _key(self) -> tuple:
        return (self._type, self._lens, self._strides, self._dyn)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Shape):
            return False
        return (
            self._lens == other._lens
            and self._strides == other._strides
            and self._type == other._type
            and self._dyn == other._dyn
        )

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._key())
        return self._hash

    def __str__(self) -> str:
        if self._dyn is not None:
            return f"{self._type}, {{{', '.join(str(d) for d in self._dyn)}}}"
        lens = ", ".join(str(x) for x in self._lens)
        strides = ", ".join(str(x) for x in self._strides)
        return f"{self._type}, {{{lens}}}, {{{strides}}}"

    def __repr__(self) -> str:
        if self._dyn is not None:
            return f"Shape({self._type!r}, dyn_dims={list(self._dyn)})"
        return f"Shape({self._type!r}, {list(self._lens)}, {list(self._strides)})"


def shape_of(array: np.ndarray) -> Shape:
    """The `Shape` describing a numpy array, strides included (in elements)."""
    itemsize = array.dtype.itemsize
    strides = [s // itemsize for s in array.strides]
    if any(s < 0 for s in strides):
        raise ValueError("arrays with negative strides have no pygraphx shape; copy them first")
    return Shape(from_dtype(array.dtype), array.shape, strides)
