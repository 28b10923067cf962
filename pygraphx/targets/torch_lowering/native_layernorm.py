"""A float32 layer normalisation with a float32 result (and, where asked, its bf16 copy in the
same pass) as a native kernel (`native/kernels/layernorm.c`, helper gemm14).

`layernorm.py` takes it for a norm whose result is float32: a float32 program's norms (BERT's,
MiniLM's, ViT's, GPT-2's) and a post-norm transformer's norms in a bf16 program (BERT's: the
float32 result feeds the next residual sum, its bf16 copy the next products), where torch's
`torch.layer_norm` took a pass and `.to(bf16)` a second one.

Why, on the 2-core AMD EPYC (Zen 4, one thread, warm, thread CPU time): (128, 768) 21 us
against torch's 32, (1024, 384) 107 against 136, two threads (128, 768) 11 against 17; in the
models see `benchmarks/results/gemm14.md`. Numbers: the mean and the biased variance of each
row in two passes (float32 lanes, their partial sums added in double), then `(x - mean) * rstd
* w + b` in float32 as torch computes it (within float32 roundings of torch's result); the bf16
copy rounds that float32 result to nearest even, as `.to(torch.bfloat16)` does.

`PGX_CPU_LAYERNORM_NATIVE=0` keeps the old kernels (torch's, and `.to` for the copy). Without
a C compiler or AVX-512F (AVX-512 BF16 for the copy) the norm takes them too, said once
(`native.announce_fallback`). An input that is not contiguous float32 of the norm's shape goes
to torch's kernel (said once per norm on the `pygraphx.cpu` logger).
"""

from __future__ import annotations

import ctypes
import logging

import torch

from pygraphx.ir.env import switch_on
from pygraphx.targets import native

log = logging.getLogger("pygraphx.cpu")
Tensor = torch.Tensor
KERNEL = "layernorm"
#: `0` / `off`: float32 norms stay on torch's kernel
ENV = "PGX_CPU_LAYERNORM_NATIVE"
#: `0` / `off`: the native kernel never writes over its input (`layernorm._over_input`)
INPLACE_ENV = "PGX_CPU_LAYERNORM_INPLACE"
#: `0` / `off`: a float32 norm writes a new tensor each run, never its arena slot
#: (`layernorm._slot`, helper gpt16)
SLOT_ENV = "PGX_CPU_LAYERNORM_SLOT"
#: `0` / `off`: a float32 norm whose result is only rounded to bf16 (GPT-2's in a bf16 program)
#: stays on oneDNN's primitive (`layernorm._kernel`) instead of this kernel's bf16-only pass
BF16_ENV = "PGX_CPU_LAYERNORM_NATIVE_BF16"
#: `0` / `off`: the kernel's first rows (`ln_f32`: each row's lane sums added one by one in
#: double) instead of v2's (`ln_f32_v2`: the same double sums reduced in vector registers;
#: helper norms18, `benchmarks/results/norms18.md`)
V2_ENV = "PGX_CPU_LAYERNORM_V2"
F32, BF16 = torch.float32, torch.bfloat16
empty, get_num_threads = torch.empty, torch.get_num_threads

def enabled() -> bool:
    return switch_on(ENV)


def inplace_enabled() -> bool:
    return switch_on(INPLACE_ENV)


def bf16_only_enabled() -> bool:
    return switch_on(BF16_ENV)


def v2_enabled() -> bool:
    return switch_on(V2_ENV)


def slot_enabled() -> bool:
    return switch_on(SLOT_ENV)


def _bind(lib: ctypes.CDLL) -> None:
    for name in ("ln_supported", "ln_bf16_supported"):
        getattr(lib, name).argtypes = []
        getattr(lib, name).restype = ctypes.c_int
    if not lib.ln_supported():
        raise native.NativeUnavailable(
            f"native kernel {KERNEL}: this processor has no AVX-512F (the build has no kernel)"
        )
    p, i = ctypes.c_void_p, ctypes.c_int64
    lib.ln_f32.argtypes = [p, p, p, p, p, i, i, i, i, i, ctypes.c_float, i]
    lib.ln_f32.restype = ctypes.c_int
    lib.ln_f32_v2.argtypes = lib.ln_f32.argtypes
    lib.ln_f32_v2.restype = ctypes.c_int
    f = ctypes.c_float  # helper norms18's fused steps (`norm_pool.py`, `embed_norm.py`)
    lib.ln_pool_f32.argtypes = [p, p, i, p, p, p, p, i, i, i, i, i, i, i, f, i, f, i, f, i]
    lib.ln_pool_f32.restype = ctypes.c_int
    lib.ln_embed_f32.argtypes = [p, p, p, i, i, i, i, f, i, p, p, p, p, i]
    lib.ln_embed_f32.restype = ctypes.c_int


#: the library, bound once; a failed build is kept for the process (`native.BoundLibrary`)
_BOUND = native.BoundLibrary(KERNEL, _bind)


def library() -> ctypes.CDLL:
    """The kernel's library, its functions bound; raises `native.NativeUnavailable`."""
    return _BOUND.get()


def available(copy: bool) -> bool:
    """Whether the native route is on and can be had for a norm (with a bf16 copy when
    `copy`), announcing once why not."""
    if not enabled():
        return False
    try:
        lib = library()
        if copy and not lib.ln_bf16_supported():
            raise native.NativeUnavailable(
                f"native kernel {KERNEL}: no AVX-512 BF16 in this build (the bf16 copy)"
            )
    except native.NativeUnavailable as exc:
        native.announce_fallback(KERNEL, exc, "torch's layer norm")
        return False
    return True


class LayerNorm:
    """`torch.layer_norm(x, (n,), weight, bias, eps)` of a float32 `x` of shape `dims` into a
    new float32 tensor (`inplace`: into `x` itself, each row read before it is written); with
    `copy` a call returns (y, y rounded to bf16), both written in the one pass; with `only_copy`
    (and `copy`) it returns y rounded to bf16 alone, the float32 y never stored."""

    def __init__(self, dims: tuple[int, ...], weight: Tensor | None, bias: Tensor | None,
                 eps: float, copy: bool = False, inplace: bool = False,
                 only_copy: bool = False, out: Tensor | None = None) -> None:  # fmt: skip
        if only_copy and (not copy or inplace):
            raise ValueError("native layer norm: only_copy needs copy and not inplace")
        if out is not None and (copy or inplace or out.dtype != F32 or not out.is_contiguous()
                                or tuple(out.shape) != tuple(dims)):  # fmt: skip
            raise ValueError("native layer norm: out must be a dense float32 tensor of the "
                             "norm's shape, without copy or inplace")
        self.out = out
        self.lib = library()
        self.fn = self.lib.ln_f32_v2 if v2_enabled() else self.lib.ln_f32
        self.dims, self.n = dims, dims[-1]
        self.rows = 1
        for d in dims[:-1]:
            self.rows *= d
        self.weight = None if weight is None else weight.to(F32).contiguous()
        self.bias = None if bias is None else bias.to(F32).contiguous()
        self.eps, self.copy, self.inplace, self.only_copy = float(eps), copy, inplace, only_copy
        w = None if self.weight is None else self.weight.data_ptr()
        b = None if self.bias is None else self.bias.data_ptr()
        self.fixed = (w, b, self.rows, self.n, self.n, self.n, self.n, ctypes.c_float(self.eps))
        self.warned = False

    def __call__(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """Few calls on the way: in a model this runs right after a weight product, its code
        out of the caches (`layernorm._kernel`)."""
        if x.dtype == F32 and x.shape == self.dims and x.is_contiguous():
            y = (None if self.only_copy else x if self.inplace else
                 self.out if self.out is not None else empty(self.dims, dtype=F32))  # fmt: skip
            yb = empty(self.dims, dtype=BF16) if self.copy else None
            rc = self.fn(x.data_ptr(), None if y is None else y.data_ptr(),
                         None if yb is None else yb.data_ptr(), *self.fixed,
                         get_num_threads())  # fmt: skip
            if rc:
                raise RuntimeError(f"native kernel {KERNEL}: not built for this processor")
            if y is None:
                return yb
            return y if yb is None else (y, yb)
        if not self.warned:
            self.warned = True
            log.warning(
                "cpu layer norm %s: input %s %s %s is not contiguous float32 of that shape, "
                "torch's kernel instead of the native one",
                list(self.dims), list(x.shape), x.dtype, tuple(x.stride()),
            )  # fmt: skip
        y = torch.layer_norm(x, (self.n,), self.weight, self.bias, self.eps)
        if self.out is not None:
            return self.out.copy_(y)
        if self.only_copy:
            return y.to(BF16)
        return (y, y.to(BF16)) if self.copy else y


__all__ = [
    "BF16_ENV",
    "ENV",
    "INPLACE_ENV",
    "SLOT_ENV",
    "V2_ENV",
    "LayerNorm",
    "available",
    "bf16_only_enabled",
    "enabled",
    "inplace_enabled",
    "slot_enabled",
    "v2_enabled",
]
