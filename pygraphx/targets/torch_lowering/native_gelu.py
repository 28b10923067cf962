"""GELU (its tanh approximation, and the erf form) in place over a float32 product, as a
native kernel (`native/kernels/gelu.c`, helpers gemm15 and gelu16).

`lower_gemm._fuse_dot` takes it for a float32 product whose group is `gelu_tanh(x @ w + b)` (GPT-2's
FFN-up): the product (with its bias) without oneDNN's gelu_tanh post-op, then this pass over the
result, in place. Why, on the 2-core AMD EPYC (Zen 4, one thread, warm): oneDNN 3.2's post-op
made the 128 x 768 x 3072 product 6024 us against 5669 without it (355 us for 393K values,
~4 cycles a value); the kernel's pass is ~110 us (`benchmarks/results/gemm15.md`). Numbers:
`x / (1 + exp(-2u))`, `u = sqrt(2/pi) (x + 0.044715 x^3)`, the same function as
`0.5 x (1 + tanh(u))`, within 17 float32 units of float64 where |y| > 1e-3 (torch's float32
GELU: 437; tested).

The erf form, `gelu(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2))` (BERT, ViT, MiniLM; `GeluErf`),
the same way where the group is `gelu(x @ w + b)` (helper gelu16): `native/kernels/vmath.h`'s
`vm_gelu_erf_ps`, a vector of 16 values with -1.5 < x < 2 as `x (0.5 + x P(x^2))` (P of degree
7), any other as `relu(x) - |x| Phi(-|x|)` with `Phi(-|x|) = t H(t) 2^(-x^2 log2(e) / 2)`,
`t = 1 / (1 + 0.35 |x|)`: relative accuracy in the negative tail too (within 1e-6 max(1,
x^2 / 4) of float64 and 20 float32 units where |y| > 1e-3; torch's float32 gelu and oneDNN's
post-op compute 1 + erf in float32: 0 or noise below x = -5.5, thousands of units near -3).
Its cost, 128 x 3072 float32, one thread, the 2-core EPYC: ~85 us a call where the values are
mostly small (BERT / ViT with random weights), ~160 us where many are below -1.5 (MiniLM),
against 150-210 us for oneDNN's gelu_erf post-op (`benchmarks/results/gelu16.md`). A third
form between the two (helper tfov17, `vm_gelu_erf3_ps`): a vector whose values all have |x| < 4
as `relu(x) - |x| s(|x|)^8`, s = Phi(-|x|)^(1/8) a polynomial of degree 9 (15 operations against
the tail's ~26; the same relative bound): most of MiniLM's vectors (trained weights) fall there;
`PGX_CPU_GELU_ERF_MIDDLE=0` keeps the two forms, in the float32 pass and in the bf16 one
(`benchmarks/results/tfov17.md`).

`PGX_CPU_GELU_NATIVE=0` keeps oneDNN's post-op for both forms, `PGX_CPU_GELU_ERF_NATIVE=0` for
the erf form only. A bf16 program's FFN-up keeps oneDNN's bf16 post-op unless
`PGX_CPU_GELU_BF16_NATIVE=1`: then the product is written in float32 and `GeluErfToBf16` rounds
GELU once to bf16 (as the post-op; BERT-base b1 0.995x, MiniLM 1.013x, one thread, the error
the same within its spread over four inputs). Without a C compiler or AVX-512F (AVX512_BF16
for the bf16 pass) the product keeps the post-op too, said once (`native.announce_fallback`).
"""

from __future__ import annotations

import ctypes

import torch

from pygraphx.ir.env import switch_on
from pygraphx.targets import native

KERNEL = "gelu"
#: `0` / `off`: a float32 product keeps oneDNN's gelu_tanh and gelu (erf) post-ops
ENV = "PGX_CPU_GELU_NATIVE"
#: `0` / `off`: a float32 product keeps oneDNN's gelu (erf) post-op (the tanh pass stays)
ERF_ENV = "PGX_CPU_GELU_ERF_NATIVE"
#: `0` / `off`: the erf passes in two forms (central, tail), not three (the middle form, |x| < 4,
#: between them: MiniLM's trained FFN-up values take it; helper tfov17): both of them, the
#: float32 one (`GeluErf`) and the bf16 one (`GeluErfToBf16`), read when the pass is made
MIDDLE_ENV = "PGX_CPU_GELU_ERF_MIDDLE"
#: `1` / `on`: a bf16 product's gelu (erf) group as the product written in float32 and
#: `GeluErfToBf16` (off by default: MiniLM 1.3 % slower at one thread, the error the same over
#: four inputs; `benchmarks/results/gelu16.md`)
BF16_ENV = "PGX_CPU_GELU_BF16_NATIVE"


Tensor = torch.Tensor


def _bind(lib: ctypes.CDLL) -> None:
    lib.gelu_supported.argtypes = []
    lib.gelu_supported.restype = ctypes.c_int
    if not lib.gelu_supported():
        raise native.NativeUnavailable(
            f"native kernel {KERNEL}: this processor has no AVX-512F (the build has no kernel)"
        )
    for fn in (lib.gelu_tanh_f32, lib.gelu_erf_f32, lib.gelu_erf_middle_f32):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        fn.restype = ctypes.c_int
    lib.gelu_bf16_supported.argtypes = []
    lib.gelu_bf16_supported.restype = ctypes.c_int
    for fn in (lib.gelu_erf_f32_bf16, lib.gelu_erf_two_f32_bf16):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        fn.restype = ctypes.c_int


_BOUND = native.BoundLibrary(KERNEL, _bind)


def available(act: str = "gelu_tanh", bf16: bool = False) -> bool:
    """Whether the pass for `act` (`gelu_tanh` or `gelu`, the erf form) over a float32 product,
    or with `bf16` the erf form's pass from a bf16 product's float32 result to bf16
    (`GeluErfToBf16`), is switched on and the kernel can be had (announcing once why not)."""
    if act not in PASSES or not switch_on(ENV) or (act == "gelu" and not switch_on(ERF_ENV)):
        return False
    if bf16 and (act != "gelu" or not switch_on(BF16_ENV, default=False)):
        return False
    route = f"oneDNN's {act} post-op"
    if not _BOUND.available(route):
        return False
    if bf16 and not _BOUND.get().gelu_bf16_supported():
        native.announce_fallback(f"{KERNEL}_bf16", "native kernel gelu: no AVX512_BF16", route)
        return False
    return True


class GeluTanh:
    """`t = gelu_tanh(t)` in place for a dense float32 tensor `t`; returns `t`."""

    name = "gelu_tanh"

    def __init__(self) -> None:
        self.fn = getattr(_BOUND.get(), f"{self.name}_f32")
        self.threads = torch.get_num_threads

    def __call__(self, t: Tensor) -> Tensor:
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"native {self.name}: a dense float32 tensor, got {t.dtype} "
                             f"{tuple(t.stride())}")  # fmt: skip
        if self.fn(t.data_ptr(), t.numel(), self.threads()):
            raise RuntimeError(f"native kernel {KERNEL}: not built for this processor")
        return t


class GeluErf(GeluTanh):
    """`t = gelu(t)` (erf form, `0.5 t (1 + erf(t / sqrt 2))`) in place for a dense float32
    tensor `t`; returns `t`."""

    name = "gelu_erf"

    def __init__(self) -> None:
        super().__init__()
        if switch_on(MIDDLE_ENV):  # the three forms (vmath.h's vm_gelu_erf3_ps)
            self.fn = _BOUND.get().gelu_erf_middle_f32


class GeluErfToBf16:
    """`gelu(t)` (erf form) of a dense float32 tensor `t` (a bf16 product's float32 result),
    rounded once to a new bf16 tensor of its shape: `GeluErf`'s value rounded once, in its
    forms (three, or two where `MIDDLE_ENV` is off)."""

    def __init__(self) -> None:
        lib = _BOUND.get()
        if not lib.gelu_bf16_supported():
            raise native.NativeUnavailable(
                f"native kernel {KERNEL}: this processor has no AVX512_BF16 (no bf16 pass)"
            )
        # the three forms (vmath.h's vm_gelu_erf3_ps), else the two (review17c)
        self.fn = lib.gelu_erf_f32_bf16 if switch_on(MIDDLE_ENV) else lib.gelu_erf_two_f32_bf16
        self.threads = torch.get_num_threads
        self.empty, self.bf16 = torch.empty, torch.bfloat16

    def __call__(self, t: Tensor) -> Tensor:
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"native gelu_erf to bf16: a dense float32 tensor, got {t.dtype} "
                             f"{tuple(t.stride())}")  # fmt: skip
        out = self.empty(t.shape, dtype=self.bf16)
        if self.fn(t.data_ptr(), out.data_ptr(), t.numel(), self.threads()):
            raise RuntimeError(f"native kernel {KERNEL}: not built for this processor")
        return out


#: the pass of each activation `lower_gemm` may take off oneDNN
PASSES: dict[str, type[GeluTanh]] = {"gelu_tanh": GeluTanh, "gelu": GeluErf}


__all__ = [
    "BF16_ENV",
    "ENV",
    "ERF_ENV",
    "PASSES",
    "GeluErf",
    "GeluErfToBf16",
    "GeluTanh",
    "MIDDLE_ENV",
    "available",
]
