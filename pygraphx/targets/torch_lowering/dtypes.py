"""Element types between the IR (numpy dtypes), torch tensors, and numpy views of them.

Tensors cross the numpy/torch border without copies (`torch.from_numpy`, `Tensor.numpy()`).
bf16 and the fp8 types have no numpy dtype that torch knows, so they cross as same-width integer
views and are re-viewed on the other side. `COMPUTE_DTYPES` are the types torch's CPU kernels do
arithmetic in; values of other types (uint16/32/64, fp8) are stored in torch tensors but computed
through the operator's numpy `compute()`. The types torch has no storage for (the sub-byte
int4/uint4/int2/uint2/fp4e2m1, e8m0, and strings as object arrays) are not `storable`: their
values stay numpy arrays wherever a tensor would be (`env_value`, `host_array`), and only the
numpy fallback computes with them.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import torch

# numpy dtype -> torch dtype (every IR type has storage in torch)
_TO_TORCH: dict[np.dtype, torch.dtype] = {
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.uint16): torch.uint16,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.uint32): torch.uint32,
    np.dtype(np.uint64): torch.uint64,
    np.dtype(ml_dtypes.bfloat16): torch.bfloat16,
    np.dtype(ml_dtypes.float8_e4m3fn): torch.float8_e4m3fn,
    np.dtype(ml_dtypes.float8_e5m2): torch.float8_e5m2,
    np.dtype(ml_dtypes.float8_e4m3fnuz): torch.float8_e4m3fnuz,
    np.dtype(ml_dtypes.float8_e5m2fnuz): torch.float8_e5m2fnuz,
}
_TO_NUMPY: dict[torch.dtype, np.dtype] = {v: k for k, v in _TO_TORCH.items()}

# dtypes numpy cannot hand to torch directly: crossed as this same-width integer type
_BITCAST: dict[np.dtype, tuple[np.dtype, torch.dtype]] = {
    np.dtype(ml_dtypes.bfloat16): (np.dtype(np.int16), torch.int16),
    np.dtype(ml_dtypes.float8_e4m3fn): (np.dtype(np.uint8), torch.uint8),
    np.dtype(ml_dtypes.float8_e5m2): (np.dtype(np.uint8), torch.uint8),
    np.dtype(ml_dtypes.float8_e4m3fnuz): (np.dtype(np.uint8), torch.uint8),
    np.dtype(ml_dtypes.float8_e5m2fnuz): (np.dtype(np.uint8), torch.uint8),
}

#: the types numpy and torch hand each other as they are (`torch.from_numpy`, `Tensor.numpy`,
#: no bitcast, no warning): the cpu executor's bind / collect take these directly, the rest
#: through `env_value` / `to_numpy`
_DIRECT = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")
DIRECT_NP = frozenset(np.dtype(name) for name in _DIRECT)
DIRECT_TORCH = frozenset(_TO_TORCH[dt] for dt in DIRECT_NP)

#: types torch's CPU kernels compute in (others fall back to numpy)
COMPUTE_DTYPES = frozenset(
    [
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    ]
)
FLOAT_DTYPES = frozenset([torch.float16, torch.bfloat16, torch.float32, torch.float64])


def torch_dtype(dtype: np.dtype | type | torch.dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (torch dtypes pass through)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    dt = np.dtype(dtype)
    try:
        return _TO_TORCH[dt]
    except KeyError:
        raise TypeError(f"numpy dtype {dt} has no torch equivalent") from None


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype."""
    try:
        return _TO_NUMPY[dtype]
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no numpy equivalent here") from None


def computable(dtype: np.dtype | torch.dtype) -> bool:
    """True when torch's CPU kernels do arithmetic in `dtype`."""
    return torch_dtype(dtype) in COMPUTE_DTYPES


def storable(dtype: np.dtype | type) -> bool:
    """True when torch has a tensor type holding `dtype` (see the module docstring)."""
    return np.dtype(dtype) in _TO_TORCH


def env_value(array: np.ndarray) -> torch.Tensor | np.ndarray:
    """`from_numpy(array)`, or the array itself for a type torch cannot hold."""
    arr = np.asarray(array)
    return from_numpy(arr) if storable(arr.dtype) else arr


def host_array(value: torch.Tensor | np.ndarray) -> np.ndarray:
    """A numpy view of a value `env_value` made (a CPU tensor, or an array torch cannot hold)."""
    return value if isinstance(value, np.ndarray) else to_numpy(value)


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing `array`'s memory (read-only arrays too: the runtime never writes
    literals or parameters)."""
    arr = np.asarray(array)
    if any(s < 0 for s in arr.strides):
        arr = np.ascontiguousarray(arr)
    bitcast = _BITCAST.get(arr.dtype)
    if bitcast is None and arr.flags.writeable:  # no warning to silence (catch_warnings
        return torch.from_numpy(arr)  # costs ~25 us a call after a run's steps, MobileNetV2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # non-writable arrays: we never write them
        if bitcast is None:
            return torch.from_numpy(arr)
        return torch.from_numpy(arr.view(bitcast[0])).view(_TO_TORCH[arr.dtype])


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (no copy)."""
    dt = _TO_NUMPY[tensor.dtype]
    bitcast = _BITCAST.get(dt)
    if bitcast is None:
        return tensor.numpy()
    return tensor.view(bitcast[1]).numpy().view(dt)


def python_scalar(value: object, dtype: torch.dtype | np.dtype) -> bool | int | float:
    """`value` rounded to `dtype` (as numpy's `asarray(value, dtype)`), as a Python scalar."""
    np_dt = numpy_dtype(dtype) if isinstance(dtype, torch.dtype) else np.dtype(dtype)
    with np.errstate(all="ignore"):
        v = np.asarray(value).astype(np_dt)
    if np_dt == np.bool_:
        return bool(v)
    if np_dt.kind in "iu":
        return int(v)
    return float(v.astype(np.float64))
