"""GELU's tanh approximation in place over a float32 product, as a native kernel
(`native/kernels/gelu.c`, helper gemm15).

`lower_gemm._fuse_dot` takes it for a float32 product whose group is `gelu_tanh(x @ w + b)` (GPT-2's
FFN-up): the product (with its bias) without oneDNN's gelu_tanh post-op, then this pass over the
result, in place. Why, on the 2-core AMD EPYC (Zen 4, one thread, warm): oneDNN 3.2's post-op
made the 128 x 768 x 3072 product 6024 us against 5669 without it (355 us for 393K values,
~4 cycles a value); the kernel's pass is ~110 us (`benchmarks/results/gemm15.md`). Numbers:
`x / (1 + exp(-2u))`, `u = sqrt(2/pi) (x + 0.044715 x^3)`, the same function as
`0.5 x (1 + tanh(u))`, within 17 float32 units of float64 where |y| > 1e-3 (torch's float32
GELU: 437; tested).

`PGX_CPU_GELU_NATIVE=0` keeps oneDNN's post-op. Without a C compiler or AVX-512F the product
keeps it too, said once (`native.announce_fallback`).
"""

from __future__ import annotations

import ctypes

import torch

from pygraphx.ir.env import switch_on
from pygraphx.targets import native

KERNEL = "gelu"
#: `0` / `off`: a float32 product keeps oneDNN's gelu_tanh post-op
ENV = "PGX_CPU_GELU_NATIVE"
Tensor = torch.Tensor


def _bind(lib: ctypes.CDLL) -> None:
    lib.gelu_supported.argtypes = []
    lib.gelu_supported.restype = ctypes.c_int
    if not lib.gelu_supported():
        raise native.NativeUnavailable(
            f"native kernel {KERNEL}: this processor has no AVX-512F (the build has no kernel)"
        )
    lib.gelu_tanh_f32.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.gelu_tanh_f32.restype = ctypes.c_int


_BOUND = native.BoundLibrary(KERNEL, _bind)


def available() -> bool:
    """Whether the switch is on and the kernel can be had (announcing once why not)."""
    return switch_on(ENV) and _BOUND.available("oneDNN's gelu_tanh post-op")


class GeluTanh:
    """`t = gelu_tanh(t)` in place for a dense float32 tensor `t`; returns `t`."""

    def __init__(self) -> None:
        self.fn = _BOUND.get().gelu_tanh_f32
        self.threads = torch.get_num_threads

    def __call__(self, t: Tensor) -> Tensor:
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"native gelu_tanh: a dense float32 tensor, got {t.dtype} "
                             f"{tuple(t.stride())}")  # fmt: skip
        if self.fn(t.data_ptr(), t.numel(), self.threads()):
            raise RuntimeError(f"native kernel {KERNEL}: not built for this processor")
        return t


__all__ = ["ENV", "GeluTanh", "available"]
