"""MIGraphX's device API: `to_gpu`, `from_gpu`, `allocate_gpu` and the device argument.

A `GpuArgument` is a shape plus a torch tensor on a GPU. Programs compiled with
`offload_copy=False` take them (or torch tensors, or any DLPack object) as parameters and
return them; `np.array(gpu_argument)` copies to the host, as `from_gpu` does. DLPack
(`__dlpack__`) lets other frameworks take the tensor without a copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pygraphx.ir.argument import Argument
from pygraphx.ir.shape import Shape
from pygraphx.targets.gpu import check_gpu
from pygraphx.targets.torch_lowering.dtypes import from_numpy, numpy_dtype, to_numpy, torch_dtype


class GpuArgument:
    """A tensor in device memory (see the module docstring)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def get_shape(self) -> Shape:
        t = self.tensor
        return Shape(numpy_dtype(t.dtype), list(t.shape), list(t.stride()))

    def data(self) -> torch.Tensor:
        return self.tensor

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = np.array(from_gpu(self))
        return arr if dtype is None else arr.astype(dtype)

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self.tensor.__dlpack_device__()

    def __repr__(self) -> str:
        return f"gpu_argument({self.get_shape()}, device={self.tensor.device})"


def as_device_tensor(value: Any) -> torch.Tensor | None:
    """`value` as a torch tensor when it lives on a GPU (GpuArgument, tensor, DLPack), else None
    (numpy arrays, Arguments, host tensors)."""
    if isinstance(value, GpuArgument):
        return value.tensor
    if isinstance(value, torch.Tensor):
        return value if value.device.type == "cuda" else None
    if isinstance(value, np.ndarray | Argument) or not hasattr(value, "__dlpack__"):
        return None
    t = torch.from_dlpack(value)
    return t if t.device.type == "cuda" else None


def to_gpu(arg: Any, device_id: int = 0) -> GpuArgument:
    """Copy an argument / array to device `device_id`."""
    check_gpu(device_id)
    arr = np.asarray(arg.array if isinstance(arg, Argument) else arg)
    t = from_numpy(np.asarray(arr, order="C")).to(torch.device("cuda", device_id))
    return GpuArgument(t)


def from_gpu(arg: Any) -> Argument:
    """Copy a device argument (or tensor) to the host."""
    t = arg.tensor if isinstance(arg, GpuArgument) else arg
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"from_gpu takes a gpu argument or torch tensor, not {type(arg).__name__}")
    return Argument(to_numpy(t.detach().contiguous().cpu()))


def allocate_gpu(shape: Shape, device_id: int = 0) -> GpuArgument:
    """Uninitialised device memory for `shape` (standard strides)."""
    check_gpu(device_id)
    dtype = torch_dtype(shape.dtype())
    t = torch.empty(shape.lens(), dtype=dtype, device=torch.device("cuda", device_id))
    return GpuArgument(t)


__all__ = ["GpuArgument", "allocate_gpu", "as_device_tensor", "from_gpu", "to_gpu"]
