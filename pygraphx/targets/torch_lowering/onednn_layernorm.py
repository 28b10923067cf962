"""A float32 layer normalisation on the CPU as oneDNN's layer-normalisation primitive: one
pass over the input writing the output in float32 or directly in bf16, where torch's
`F.layer_norm` writes float32 and a bf16 result takes a second pass. `layernorm.py` uses it for
a norm rounded to bf16 for its products (a pre-norm transformer's, GPT-2's, in a bf16 program).

Why, on the 2-core AMD EPYC (Zen 4, avx512_bf16, one thread, thread CPU time, (1, 128, 768),
caches flushed before each call): that norm took 34 us against torch's 58-62 (layer norm then
`.to(bf16)`); in GPT-2 at bf16 (batch 1) the 25 norms 1.87 ms a run against 2.35. A float32
output plus its bf16 copy (a post-norm transformer's, BERT's) took 47 us against 57-60 alone
but no less in the model, so those stay on torch's kernel. Numbers: oneDNN computes the
statistics and the affine part in float32 and rounds once, as torch does (outputs within a
float32 rounding of torch's).

A primitive depends on the shape, the output type, eps, the affine parts and the thread count,
so `LayerNorm` makes it at its first call with a new thread count; primitives live in a table
shared by a program's norms. An input that is not contiguous float32 of the norm's shape goes
to torch's kernel (a copy would cost what the primitive saves), said once per norm on the
`pygraphx.cpu` logger.
`PGX_CPU_LAYERNORM=torch` keeps torch's kernel for every norm (A/B measurements).
"""

from __future__ import annotations

import logging
import os
from ctypes import POINTER, byref, c_float, c_int, c_uint, c_void_p

import torch

from pygraphx.targets.torch_lowering.onednn_capi import (
    ARG_DST,
    ARG_SRC,
    BF16,
    F32,
    FORWARD_INFERENCE,
    ExecArg,
    OneDnnError,
    Runtime,
    check,
    release,
    runtime,
)

log = logging.getLogger("pygraphx.cpu")
Tensor = torch.Tensor
F32_T = torch.float32
empty, get_num_threads = torch.empty, torch.get_num_threads
#: the environment variable choosing the kernel: `onednn` (the default) or `torch`
KERNEL_ENV = "PGX_CPU_LAYERNORM"
#: oneDNN 3.x's normalisation flags and execution arguments of the affine parts
USE_SCALE, USE_SHIFT = 0x2, 0x4
ARG_SCALE, ARG_SHIFT = 51, 52
#: oneDNN's plain row-major tags for 1 to 6 axes (`dnnl_a` ... `dnnl_abcdef`)
TAG_PLAIN = {1: 2, 2: 3, 3: 4, 4: 5, 5: 6, 6: 7}
DTYPES = {torch.float32: F32, torch.bfloat16: BF16}


def _declare(rt: Runtime) -> None:
    fn = rt.lib.dnnl_layer_normalization_forward_primitive_desc_create
    fn.restype = c_int
    fn.argtypes = [POINTER(c_void_p), c_void_p, c_int, c_void_p, c_void_p, c_void_p, c_float,
                   c_uint, c_void_p]  # fmt: skip


def wanted() -> bool:
    """`PGX_CPU_LAYERNORM` is not `torch` and oneDNN's C API library is loaded."""
    if os.environ.get(KERNEL_ENV, "onednn").strip().lower() == "torch":
        return False
    return runtime() is not None


class Primitive:
    """One layer-normalisation primitive over the last axis of `dims` (float32 in, `out` out),
    with its memory objects (destroyed with it)."""

    def __init__(self, rt: Runtime, dims: tuple[int, ...], out: torch.dtype, eps: float,
                 affine: tuple[bool, bool]) -> None:  # fmt: skip
        self.rt, lib = rt, rt.lib
        self.pd, self.prim, self.mems, mds = c_void_p(), None, [], []
        try:
            tag = TAG_PLAIN[len(dims)]
            mds = [rt.desc(list(dims), F32, tag), rt.desc(list(dims), DTYPES[out], tag),
                   rt.desc([dims[-1]], F32, TAG_PLAIN[1])]  # fmt: skip
            flags = (USE_SCALE if affine[0] else 0) | (USE_SHIFT if affine[1] else 0)
            status = lib.dnnl_layer_normalization_forward_primitive_desc_create(
                byref(self.pd), rt.engine, FORWARD_INFERENCE, mds[0], mds[1], None,
                c_float(eps), c_uint(flags), None,
            )  # fmt: skip
            check(status, f"layer_normalization_forward_primitive_desc_create{dims}")
            self.impl = rt.impl_name(self.pd)
            if self.impl.startswith("ref"):
                raise OneDnnError(f"layer norm {list(dims)}: oneDNN offers its reference only")
            self.prim = rt.primitive(self.pd)
            kinds = [(ARG_SRC, mds[0]), (ARG_DST, mds[1])]
            kinds += [
                (a, mds[2]) for a, on in zip((ARG_SCALE, ARG_SHIFT), affine, strict=True) if on
            ]
            self.mems = [rt.memory(md, None) for _, md in kinds]
            self.n = len(kinds)
            self.args = (ExecArg * len(kinds))(
                *(ExecArg(a, m) for (a, _), m in zip(kinds, self.mems, strict=True))
            )
        finally:
            release(lib, [], None, None, mds)

    def run(self, *addresses: int) -> None:
        """Normalise: the input, output, scale and shift at these addresses (those it has)."""
        set_handle = self.rt.lib.dnnl_memory_set_data_handle
        for mem, address in zip(self.mems, addresses, strict=True):
            set_handle(mem, address)
        status = self.rt.lib.dnnl_primitive_execute(self.prim, self.rt.stream, self.n, self.args)
        if status:
            check(status, "layer norm execute")

    def __del__(self) -> None:
        release(self.rt.lib, self.mems, self.prim, self.pd if self.pd.value else None)


class LayerNorm:
    """`F.layer_norm(x, (n,), weight, bias, eps)` of a float32 `x` of shape `dims`, written in
    `out` (float32 or bf16), on oneDNN's primitive (kept in `table`, shared by a program's
    norms) where it takes `x`, else torch's kernel (then rounded to `out`)."""

    def __init__(self, table: dict, dims: tuple[int, ...], weight: Tensor | None,
                 bias: Tensor | None, eps: float, out: torch.dtype) -> None:  # fmt: skip
        self.table, self.dims, self.eps, self.out = table, dims, eps, out
        self.weight, self.bias = weight, bias
        self.fixed = [t.data_ptr() for t in (weight, bias) if t is not None]
        self.prims: dict[int, Primitive | None] = {}
        self.threads, self.prim = 0, None  # the last call's thread count and its primitive
        self.warned = False

    def _primitive(self, threads: int) -> Primitive | None:
        affine = (self.weight is not None, self.bias is not None)
        key = (self.dims, self.out, self.eps, affine, threads)
        if key not in self.table:
            rt = runtime()
            assert rt is not None
            _declare(rt)
            try:
                self.table[key] = Primitive(rt, self.dims, self.out, self.eps, affine)
            except OneDnnError as exc:
                log.warning("cpu layer norm %s: torch's kernel instead of oneDNN (%s)",
                            list(self.dims), exc)  # fmt: skip
                self.table[key] = None
        return self.table[key]

    def __call__(self, x: Tensor) -> Tensor:
        """The normalised `x`, a new tensor of type `out`.

        Few calls on the way (the thread count, then one check of `x`): in a model this runs
        right after a weight product, its code out of the caches, where each call into torch or
        ctypes costs several microseconds (`benchmarks/attn10_cold.py`)."""
        threads = get_num_threads()
        if threads != self.threads:
            self.prim = self.prims.get(threads, False)
            if self.prim is False:
                self.prim = self.prims[threads] = self._primitive(threads)
            self.threads = threads
        prim = self.prim
        if prim is not None and x.dtype == F32_T and x.shape == self.dims and x.is_contiguous():
            y = empty(self.dims, dtype=self.out)
            prim.run(x.data_ptr(), y.data_ptr(), *self.fixed)
            return y
        if prim is not None and not self.warned:
            self.warned = True
            log.warning(
                "cpu layer norm %s: input %s %s %s is not contiguous float32 of that shape, "
                "torch's kernel instead of oneDNN",
                list(self.dims), list(x.shape), x.dtype, tuple(x.stride()),
            )  # fmt: skip
        y = torch.layer_norm(x, (self.dims[-1],), self.weight, self.bias, self.eps)
        return y.to(self.out)


__all__ = ["LayerNorm", "wanted"]
