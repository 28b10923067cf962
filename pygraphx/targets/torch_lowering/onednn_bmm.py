"""A batched matrix product with a constant right operand as a oneDNN matmul primitive.

`BatchedMatmul(weight)` computes `src[b] @ weight[b]` for float32 (B, M, C) sources and the
constant (B, C, K) weight (the Winograd kernel's (m + 2)^2 products, `winograd.py`). The
primitive is made once per source row count and thread count (oneDNN splits a primitive's work
for the threads it was made for) and reads the weight where it is, row-major (oneDNN's packed
layout, `any`, ran no faster on these shapes and would be a second copy). On the 2-core EPYC
(Zen 4, 1 thread) oneDNN's brgemm kernel ran ResNet-50's Winograd products at 93-114 GFLOP/s
where `torch.bmm` (MKL) ran 69-92.

Without oneDNN's C API library (`onednn_capi.library`), `torch.bmm` computes the products,
and the first use says so once on the `pygraphx.cpu` logger.
"""

from __future__ import annotations

import logging
from ctypes import POINTER, byref, c_int, c_void_p

import torch

from pygraphx.targets.torch_lowering.onednn_capi import (
    ARG_DST,
    ARG_SRC,
    ARG_WEIGHTS,
    F32,
    ExecArg,
    Runtime,
    check,
    release,
    runtime,
    unavailable_reason,
)

log = logging.getLogger("pygraphx.cpu")
Tensor = torch.Tensor
#: oneDNN's row-major tag of three axes (`dnnl_abc`)
TAG_ABC = 4
_ANNOUNCED: set[str] = set()
#: the matmul constructor's argument types (not among `onednn_capi`'s declared functions)
_MATMUL_ARGS = [POINTER(c_void_p), *[c_void_p] * 6]


def _declare(rt: Runtime) -> None:
    fn = rt.lib.dnnl_matmul_primitive_desc_create
    fn.restype, fn.argtypes = c_int, _MATMUL_ARGS


class _Primitive:
    """One matmul primitive for (B, M, C) x (B, C, K) and its memories."""

    def __init__(self, rt: Runtime, weight: Tensor, rows: int) -> None:
        self.rt, lib = rt, rt.lib
        _declare(rt)
        b, c, k = weight.shape
        self.out_shape = (b, rows, k)
        self.weight = weight  # (contiguous: read in place by the primitive)
        self.mds = [rt.desc(dims, F32, TAG_ABC) for dims in ([b, rows, c], [b, c, k], [b, rows, k])]
        src_md, w_md, dst_md = self.mds
        self.pd, self.prim, self.mems = c_void_p(), None, []
        status = lib.dnnl_matmul_primitive_desc_create(
            byref(self.pd), rt.engine, src_md, w_md, None, dst_md, None
        )
        check(status, f"matmul primitive_desc_create ({b}, {rows}, {c}) x ({b}, {c}, {k})")
        self.prim = rt.primitive(self.pd)
        self.mems = [
            rt.memory(src_md, None),
            rt.memory(w_md, weight.data_ptr()),
            rt.memory(dst_md, None),
        ]
        pairs = zip((ARG_SRC, ARG_WEIGHTS, ARG_DST), self.mems, strict=True)
        self.args = (ExecArg * 3)(*(ExecArg(arg, mem) for arg, mem in pairs))

    def __call__(self, src: Tensor) -> Tensor:
        lib = self.rt.lib
        out = torch.empty(self.out_shape)
        lib.dnnl_memory_set_data_handle(self.mems[0], src.data_ptr())
        lib.dnnl_memory_set_data_handle(self.mems[2], out.data_ptr())
        check(lib.dnnl_primitive_execute(self.prim, self.rt.stream, 3, self.args), "matmul")
        return out

    def __del__(self) -> None:
        release(self.rt.lib, self.mems, self.prim, self.pd, self.mds)


class BatchedMatmul:
    """`src[b] @ weight[b]` for the constant float32 (B, C, K) `weight`; a call takes a
    contiguous float32 (B, M, C) source and returns a new (B, M, K) tensor."""

    def __init__(self, weight: Tensor) -> None:
        self.weight = weight.contiguous()
        self.rt = runtime()
        self._made: dict[tuple[int, int], _Primitive] = {}
        if self.rt is None and "bmm" not in _ANNOUNCED:
            _ANNOUNCED.add("bmm")
            log.warning(
                "winograd: oneDNN's C API library is not loaded (%s); its products run on "
                "torch.bmm, 20-35%% slower",
                unavailable_reason(),
            )

    def __call__(self, src: Tensor) -> Tensor:
        if self.rt is None:
            return torch.bmm(src, self.weight)
        key = (src.shape[1], torch.get_num_threads())
        prim = self._made.get(key)
        if prim is None:
            prim = self._made[key] = _Primitive(self.rt, self.weight, src.shape[1])
        return prim(src.contiguous())


__all__ = ["BatchedMatmul"]
