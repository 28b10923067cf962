"""A batched matrix product with a constant right operand as a oneDNN matmul primitive.

`BatchedMatmul(weight)` computes `src[b] @ weight[b]` for float32 (B, M, C) sources and the
constant (B, C, K) weight (the Winograd kernel's (m + 2)^2 products, `winograd.py`). The
primitive is made once per source row count and thread count (oneDNN splits a primitive's work
for the threads it was made for), its weight in the layout oneDNN chooses (`any`), reordered
once: a row-major weight is copied block by block on every call (oneDNN's brgemm packs the
right operand it reads), which cost most where the weight is read for few rows. On the 2-core
EPYC (Zen 4, 1 thread, the caches flushed before each call) the packed weight ran ResNet-50's
512-channel products at 32 rows (7x7 maps, batch 8) in 6.3 ms instead of 8.8 (2 threads: 3.2
instead of 5.6), at 4 rows (batch 1) 1.7 instead of 4.0, the 256-channel ones at 16 rows
(14x14, batch 1) 0.97 instead of 1.18; layers of many rows about alike
(`benchmarks/results/wino2.md`). Earlier, row-major: oneDNN's brgemm ran ResNet-50's Winograd
products at 93-114 GFLOP/s where `torch.bmm` (MKL) ran 69-92.

Without oneDNN's C API library (`onednn_capi.library`), `torch.bmm` computes the products,
and the first use says so once on the `pygraphx.cpu` logger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from ctypes import byref, c_void_p

import torch

from pygraphx.targets.torch_lowering.onednn_capi import (
    ARG_DST,
    ARG_SRC,
    ARG_WEIGHTS,
    F32,
    QUERY_WEIGHTS_MD,
    TAG_ABC,
    TAG_ANY,
    ExecArg,
    Runtime,
    check,
    declare_matmul,
    release,
    runtime,
    unavailable_reason,
)

log = logging.getLogger("pygraphx.cpu")
Tensor = torch.Tensor
_ANNOUNCED: set[str] = set()
#: a packed weight in a given layout
Pack = Callable[[c_void_p], Tensor]


class _Primitive:
    """One matmul primitive for (B, M, C) x (B, C, K) and its memories; its weight in the
    layout oneDNN chose for it (`pack`: the weight in that layout from a given one)."""

    def __init__(self, rt: Runtime, dims: tuple[int, int, int, int], pack: Pack) -> None:
        self.rt, lib = rt, rt.lib
        declare_matmul(rt.lib)
        b, rows, c, k = dims
        self.out_shape = (b, rows, k)
        self.mds = [
            rt.desc([b, rows, c], F32, TAG_ABC),
            rt.desc([b, c, k], F32, TAG_ANY),
            rt.desc([b, rows, k], F32, TAG_ABC),
        ]
        src_md, any_md, dst_md = self.mds
        self.pd, self.prim, self.mems = c_void_p(), None, []
        status = lib.dnnl_matmul_primitive_desc_create(
            byref(self.pd), rt.engine, src_md, any_md, None, dst_md, None
        )
        check(status, f"matmul primitive_desc_create ({b}, {rows}, {c}) x ({b}, {c}, {k})")
        #: the weight's layout (owned by the descriptor) and the weight laid out so
        self.w_md = lib.dnnl_primitive_desc_query_md(self.pd, QUERY_WEIGHTS_MD, 0)
        self.weight = pack(self.w_md)
        self.prim = rt.primitive(self.pd)
        self.mems = [
            rt.memory(src_md, None),
            rt.memory(self.w_md, self.weight.data_ptr()),
            rt.memory(dst_md, None),
        ]
        pairs = zip((ARG_SRC, ARG_WEIGHTS, ARG_DST), self.mems, strict=True)
        self.args = (ExecArg * 3)(*(ExecArg(arg, mem) for arg, mem in pairs))

    def __call__(self, src: Tensor, out: Tensor | None = None) -> Tensor:
        lib = self.rt.lib
        if out is None:
            out = torch.empty(self.out_shape)
        lib.dnnl_memory_set_data_handle(self.mems[0], src.data_ptr())
        lib.dnnl_memory_set_data_handle(self.mems[2], out.data_ptr())
        check(lib.dnnl_primitive_execute(self.prim, self.rt.stream, 3, self.args), "matmul")
        return out

    def __del__(self) -> None:
        release(self.rt.lib, self.mems, self.prim, self.pd, self.mds)


class BatchedMatmul:
    """`src[b] @ weight[b]` for the constant float32 (B, C, K) `weight`; a call takes a
    contiguous float32 (B, M, C) source and returns a new (B, M, K) tensor.

    With oneDNN, the weight is kept only in the layouts its primitives chose (one copy for
    all of them where they chose the same): its row-major form is dropped once packed."""

    def __init__(self, weight: Tensor) -> None:
        self.weight: Tensor | None = weight.contiguous()
        self.shape = tuple(weight.shape)
        self.rt = runtime()
        self._made: dict[tuple[int, int], _Primitive] = {}
        if self.rt is None and "bmm" not in _ANNOUNCED:
            _ANNOUNCED.add("bmm")
            log.warning(
                "winograd: oneDNN's C API library is not loaded (%s); its products run on "
                "torch.bmm, 20-35%% slower",
                unavailable_reason(),
            )

    def __call__(self, src: Tensor, out: Tensor | None = None) -> Tensor:
        """The products; into `out` (a contiguous float32 (B, M, K) tensor) where given."""
        if self.rt is None:
            assert self.weight is not None
            return torch.bmm(src, self.weight, out=out)
        key = (src.shape[1], torch.get_num_threads())
        prim = self._made.get(key)
        if prim is None:
            b, c, k = self.shape
            prim = self._made[key] = _Primitive(self.rt, (b, src.shape[1], c, k), self._pack)
        return prim(src.contiguous(), out)

    def _pack(self, w_md: c_void_p) -> Tensor:
        """The weight laid out as `w_md`: one a primitive already holds, or a reorder of
        the row-major weight (the first time) or of a packed one."""
        rt = self.rt
        assert rt is not None
        for made in self._made.values():
            if rt.lib.dnnl_memory_desc_equal(made.w_md, w_md):
                return made.weight
        if self.weight is not None:
            plain = rt.desc(list(self.shape), F32, TAG_ABC)
            try:
                packed = rt.reorder(self.weight, plain, w_md)
            finally:
                rt.lib.dnnl_memory_desc_destroy(plain)
            self.weight = None
            return packed
        made = next(iter(self._made.values()))
        return rt.reorder(made.weight, made.w_md, w_md)


__all__ = ["BatchedMatmul"]
