"""A fixed-weight matrix product (+ bias) as a oneDNN matmul primitive made once (C API).

`Linear(weight, bias, rows)` computes `x @ weight + bias` for a (rows, K) source and the constant
(K, N) weight, float32 or bf16 (bf16 only where oneDNN computes it natively, as the
convolutions: `gemm_kernels.cpu_has_bf16`). The primitive, its memory objects and its
scratchpad are made at prepare, the weight reordered once into the layout oneDNN picks for it
(`any`); a call sets two data pointers and executes, through oneDNN's C API (`onednn_capi.py`),
never torch's dispatcher.

Why: in a CNN every convolution and pooling step runs oneDNN through its C API, so the
classifier's product after them was the first torch op of the run, and paid torch's dispatcher
and kernel code coming back cold into the caches (60-130 us on the 2-core EPYC, MobileNetV2 at
batch 1: `benchmarks/results/mnv2b1.md`). oneDNN fixes a primitive's thread count when it is
made, so one is made per thread count the product is called under (as `onednn_conv.build`).
"""

from __future__ import annotations

import math
from ctypes import byref, c_void_p

import torch

from pygraphx.targets.torch_lowering.onednn_capi import (
    ARG_BIAS,
    ARG_DST,
    ARG_SCRATCHPAD,
    ARG_SRC,
    ARG_SRC_1,
    ARG_WEIGHTS,
    BINARY_ADD,
    DTYPES,
    ELTWISE_SWISH,
    QUERY_SCRATCHPAD_MD,
    QUERY_WEIGHTS_MD,
    SCRATCHPAD_USER,
    TAG_AB,
    TAG_ABC,
    TAG_ANY,
    ExecArg,
    OneDnnError,
    Runtime,
    check,
    declare_matmul,
    post_op_arg,
    primitive_cache_off,
    release,
    runtime,
    unavailable_reason,
)

Tensor = torch.Tensor

#: oneDNN 3.x's `dnnl_eltwise_gelu_tanh` and `dnnl_eltwise_gelu_erf`
ELTWISE_GELU_TANH, ELTWISE_GELU_ERF = 0x2B, 0x31
#: `gemm_kernels.DNNL_EPILOGUES`' activations as an eltwise post-op (algorithm, alpha, beta)
EPILOGUES = {
    "gelu": (ELTWISE_GELU_ERF, 0.0, 0.0),
    "gelu_tanh": (ELTWISE_GELU_TANH, 0.0, 0.0),
    "silu": (ELTWISE_SWISH, 1.0, 0.0),
}


def _attributes(
    lib: object,
    epilogue: str | None,
    bias_md: c_void_p | None,
    residual_md: c_void_p | None = None,
    accumulate: bool = False,
) -> c_void_p:
    """A matmul's attributes: a user scratchpad, then the post-ops: a binary add of `bias_md`
    (the bias of a product in parts), a binary add of `residual_md` (a tensor of the result's
    shape: a residual sum) and the activation `epilogue` (the caller destroys it)."""
    attr, post_ops = c_void_p(), c_void_p()
    check(lib.dnnl_primitive_attr_create(byref(attr)), "primitive_attr_create")
    try:
        check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, SCRATCHPAD_USER), "scratch")
        if epilogue is None and bias_md is None and residual_md is None and not accumulate:
            return attr
        check(lib.dnnl_post_ops_create(byref(post_ops)), "post_ops_create")
        if accumulate:  # dst += the product (oneDNN's sum post-op)
            check(lib.dnnl_post_ops_append_sum(post_ops, 1.0, 0, 0), "sum")
        for md in (bias_md, residual_md):
            if md is not None:
                check(lib.dnnl_post_ops_append_binary(post_ops, BINARY_ADD, md), "binary add")
        if epilogue is not None:
            alg, alpha, beta = EPILOGUES[epilogue]
            check(lib.dnnl_post_ops_append_eltwise(post_ops, alg, alpha, beta), "eltwise")
        check(lib.dnnl_primitive_attr_set_post_ops(attr, post_ops), "set_post_ops")
    except OneDnnError:
        lib.dnnl_primitive_attr_destroy(attr)
        raise
    finally:
        if post_ops.value:
            lib.dnnl_post_ops_destroy(post_ops)
    return attr


class _Primitive:
    """One matmul primitive for (rows, K) x (K, N) (+ bias) at the thread count of now, its
    packed weight (or `share`'s, when the layout is the same) and its memory objects."""

    def __init__(self, rt: Runtime, owner: Linear, share: _Primitive | None) -> None:
        self.rt, lib = rt, rt.lib
        declare_matmul(lib)
        fn = lib.dnnl_matmul_primitive_desc_create
        dt, dst_dt = DTYPES[owner.dtype], DTYPES[owner.out_dtype]
        src, wei, dst, bias, tag = owner.dims()
        self.mds = [rt.desc(src, dt, tag), rt.desc(wei, dt, TAG_ANY), rt.desc(dst, dst_dt, tag)]
        if owner.bias is not None:
            self.mds.append(rt.desc(bias, DTYPES[owner.bias.dtype], tag))
        src_md, w_any, dst_md = self.mds[:3]
        bias_md = self.mds[3] if owner.bias is not None else None
        # parts: the bias as a binary add post-op (oneDNN 3.2 runs a per-part bias on `ref`)
        bias_op = bias_md if owner.parts > 1 else None
        res_md = None
        if owner.residual == "add":  # (its post-op follows the bias's, if that is one)
            res_md = rt.desc(dst, dst_dt, tag)
            self.mds.append(res_md)
        attr = _attributes(lib, owner.epilogue, bias_op, res_md, owner.residual == "sum")
        self.pd, self.prim, self.mems = c_void_p(), None, []
        try:
            md = None if bias_op is not None else bias_md
            status = fn(byref(self.pd), rt.engine, src_md, w_any, md, dst_md, attr)
            check(status, f"matmul {src} x {wei} {owner.epilogue or ''}")
        finally:
            lib.dnnl_primitive_attr_destroy(attr)
        if owner.impl is not None:
            _move_to_impl(rt, self.pd, owner.impl)
        self.prim = rt.primitive(self.pd)
        self.impl = rt.impl_name(self.pd)
        self.w_md = w_md = lib.dnnl_primitive_desc_query_md(self.pd, QUERY_WEIGHTS_MD, 0)
        if share is not None and lib.dnnl_memory_desc_equal(w_md, share.w_md):
            self.weight = share.weight
        elif share is not None:  # the plain weight is gone: reordered from the packed one
            self.weight = rt.reorder(share.weight, share.w_md, w_md)
        else:
            plain = rt.desc(wei, dt, tag)
            self.mds.append(plain)
            self.weight = rt.reorder(owner.weight, plain, w_md)
        scratch_md = lib.dnnl_primitive_desc_query_md(self.pd, QUERY_SCRATCHPAD_MD, 0)
        self.scratch = torch.empty(
            max(lib.dnnl_memory_desc_get_size(scratch_md), 1), dtype=torch.uint8
        )
        self.src, self.dst = rt.memory(src_md, None), rt.memory(dst_md, None)
        self.mems = [self.src, self.dst, rt.memory(w_md, self.weight.data_ptr())]
        args = [(ARG_SRC, self.src), (ARG_DST, self.dst), (ARG_WEIGHTS, self.mems[2])]
        if owner.bias is not None:
            self.mems.append(rt.memory(bias_md, owner.bias.data_ptr()))
            args.append((ARG_BIAS if bias_op is None else post_op_arg(0, ARG_SRC_1), self.mems[-1]))
        self.mems.append(rt.memory(scratch_md, self.scratch.data_ptr()))
        args.append((ARG_SCRATCHPAD, self.mems[-1]))
        self.res = None
        if res_md is not None:
            self.res = rt.memory(res_md, None)
            self.mems.append(self.res)
            args.append((post_op_arg(1 if bias_op is not None else 0, ARG_SRC_1), self.res))
        self.nargs = len(args)
        self.args = (ExecArg * len(args))(*(ExecArg(a, m) for a, m in args))
        # (not 0: an int a step holds is taken for an env index by `mapped_reads`)
        self.addresses: list[int | None] = [None, None, None]

    def execute(self, x: Tensor, y: Tensor, r: Tensor | None = None) -> None:
        """`y = x @ weight (+ bias) (+ r)`, `x`, `y` (and the residual `r`, given exactly when
        the product has one) dense row-major."""
        lib = self.rt.lib
        pairs = ((self.src, x), (self.dst, y)) if r is None else (
            (self.src, x), (self.dst, y), (self.res, r))  # fmt: skip
        for slot, (mem, t) in enumerate(pairs):
            address = t.data_ptr()
            if self.addresses[slot] != address:
                lib.dnnl_memory_set_data_handle(mem, address)
                self.addresses[slot] = address
        check(
            lib.dnnl_primitive_execute(self.prim, self.rt.stream, self.nargs, self.args), "matmul"
        )

    def __del__(self) -> None:
        release(self.rt.lib, self.mems, self.prim, self.pd, self.mds)


class Linear:
    """`act(x @ weight + bias)` for a (rows, K) source and the constant (K, N) `weight` (see the
    module docstring; `epilogue`: None or a key of `EPILOGUES`, applied by oneDNN before the
    result is rounded to its type); a call returns a new (rows, N) tensor of the weight's
    type. The primitive for the thread count of now is made at once (`now`), others at their
    first call, from the first one's packed weight (the plain one is not kept). A `twin` (the
    same weight, rows and type, another bias or epilogue) packs nothing of its own: its
    primitives start from the twin's packed weight, shared where the layout is the same. With
    `parts` > 1 the columns are that many parts of equal width, computed as one batched
    product into a new (parts, rows, width) tensor, each part dense (`dims`). `impl`: the
    first of oneDNN's implementations whose name starts with it (e.g. `gemm:jit`; an error
    naming those offered where none does), else oneDNN's first. With `residual` the product
    adds a (rows, N) tensor of its type given at each call (`linear(x, r)`: a residual sum,
    oneDNN's binary add post-op, after the bias and before an epilogue). `out_dtype`: the
    result's type where it is not the weight's (float32 of a bf16 product: accumulated in
    float32 and never rounded to bf16; a bf16 program's residual sum into its float32 residual,
    `gemm_residual.py`)."""

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None,
        rows: int,
        now: bool = True,
        epilogue: str | None = None,
        twin: Linear | None = None,
        parts: int = 1,
        impl: str | None = None,
        residual: str | None = None,
        out_dtype: torch.dtype | None = None,
    ) -> None:
        rt = runtime()
        if rt is None:
            raise OneDnnError(f"oneDNN's C API library is not available: {unavailable_reason()}")
        if weight.dtype not in DTYPES or weight.dim() != 2:
            raise OneDnnError(f"matmul weight {list(weight.shape)} {weight.dtype}: expected a "
                              "2-D float32 or bf16 matrix")  # fmt: skip
        if epilogue is not None and epilogue not in EPILOGUES:
            raise OneDnnError(f"matmul epilogue {epilogue!r}: expected one of {sorted(EPILOGUES)}")
        if residual not in (None, "add", "sum"):
            raise OneDnnError(f"matmul residual {residual!r}: expected None, 'add' or 'sum'")
        out_dtype = weight.dtype if out_dtype is None else out_dtype
        if out_dtype not in DTYPES:
            raise OneDnnError(f"matmul result type {out_dtype}: expected float32 or bf16")
        if residual and parts != 1:
            raise OneDnnError("matmul residual: a product in parts takes none")
        if twin is not None and (twin.shape, twin.dtype, twin.rows, twin.parts) != (
            tuple(weight.shape),
            weight.dtype,
            rows,
            parts,
        ):
            raise OneDnnError("matmul twin: another weight shape, type, row count or parts")
        k, n = weight.shape
        if parts < 1 or n % parts:
            raise OneDnnError(f"matmul weight {[k, n]}: not {parts} parts of equal width")
        self.rt = rt
        # the plain weight until the first primitive has packed it (later ones, and a twin's,
        # start from that packed weight: shared where the layout is the same)
        self.twin = twin
        width = n // parts
        if twin is not None:
            self.weight: Tensor | None = None
        elif parts == 1:
            self.weight = weight.contiguous()
        else:  # (parts, K, width): part p is columns p * width ... (p + 1) * width
            self.weight = weight.reshape(k, parts, width).permute(1, 0, 2).contiguous()
        self.shape, self.dtype, self.out_dtype = (k, n), weight.dtype, out_dtype
        self.bias = None if bias is None else bias.contiguous()
        self.rows = rows
        self.epilogue = epilogue
        self.impl = impl
        self.residual = residual
        self.out_lens = (rows, n) if parts == 1 else (parts, rows, width)
        self.numel = math.prod(self.out_lens)  # (a sum destination's size, checked per call)
        self.made: dict[int, _Primitive] = {}
        if now:  # (else at the first call)
            self.primitive()

    @property
    def parts(self) -> int:
        """The column parts (1: a plain product); kept in `out_lens` only: `mapped_reads`
        takes an int a step holds for an env index."""
        return self.out_lens[0] if len(self.out_lens) == 3 else 1

    def dims(self) -> tuple[list[int], list[int], list[int], list[int], int]:
        """The source's, weight's, result's and bias's dimensions, and their row-major tag:
        (rows, K) x (K, N), or with `parts` a batched product, the source broadcast over
        (parts, K, width) weights into (parts, rows, width) (each part a dense matrix)."""
        (k, n), rows, p = self.shape, self.rows, self.parts
        if p == 1:
            return [rows, k], [k, n], [rows, n], [1, n], TAG_AB
        return [1, rows, k], [p, k, n // p], [p, rows, n // p], [p, 1, n // p], TAG_ABC

    def primitive(self) -> _Primitive:
        """The primitive for the thread count of now (made at its first call)."""
        n = torch.get_num_threads()
        prim = self.made.get(n)
        if prim is None:
            share = next(iter(self.made.values()), None)
            if share is None and self.twin is not None:
                share = self.twin.made.get(n) or self.twin.primitive()
            prim = self.made[n] = _Primitive(self.rt, self, share)
            self.weight = None
        return prim

    def __call__(self, x: Tensor, r: Tensor | None = None) -> Tensor:
        if self.residual == "sum":  # the product accumulates into its destination: `into`
            raise OneDnnError("matmul with a sum post-op: call `into(x, r)`, not the product")
        y = torch.empty(self.out_lens, dtype=self.out_dtype)
        if self.residual == "add":
            if r is None or r.dtype != self.out_dtype or r.numel() != y.numel():
                got = None if r is None else (tuple(r.shape), r.dtype)
                raise OneDnnError(
                    f"matmul residual: expected a {list(self.out_lens)} {self.out_dtype} tensor, "
                    f"got {got}"
                )
            self.primitive().execute(x.contiguous(), y, r.contiguous())
        else:
            self.primitive().execute(x.contiguous(), y)
        return y

    def into(self, x: Tensor, r: Tensor) -> Tensor:
        """`r += x @ weight (+ bias)` in place (`residual="sum"`), `r` dense; returns `r`."""
        if r.dtype != self.out_dtype or r.numel() != self.numel or not r.is_contiguous():
            raise OneDnnError(
                f"matmul sum into: expected a dense {list(self.out_lens)} {self.out_dtype} "
                "tensor, "
                f"got {tuple(r.shape)} {r.dtype}{'' if r.is_contiguous() else ' (strided)'}"
            )
        self.primitive().execute(x.contiguous(), r)
        return r


def _move_to_impl(rt: Runtime, pd: c_void_p, impl: str) -> None:
    """Move `pd` to oneDNN's first implementation whose name starts with `impl`; an error
    naming those offered where none does."""
    offered = [rt.impl_name(pd)]
    with primitive_cache_off(rt.lib):
        while not offered[-1].startswith(impl):
            if not rt.next_impl(pd):
                raise OneDnnError(f"matmul implementation {impl!r} not offered: {offered}")
            offered.append(rt.impl_name(pd))


def available() -> bool:
    """Whether oneDNN's C API library is loaded."""
    return runtime() is not None


__all__ = ["Linear", "available"]
