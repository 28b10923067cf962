"""An attention block on the CPU as three oneDNN primitives made once (`attention.py` uses it
for float32 and bf16 blocks): `s = scale * (Q @ Kt) + mask` (a matmul whose scale and mask add
are its post-ops, written in float32), `p = softmax(s)` (oneDNN's softmax, reading float32 and
writing the probabilities in the product type), `o = p @ V` (a matmul).

Why, on the 2-core AMD EPYC (Zen 4, avx512_bf16, one thread, process CPU time, BERT-base's
(12, 128, 64) heads at batch 1, Q / K / V strided head views of the fused QKV product): torch's
route (bf16 matmul, float32 scale / mask / softmax, bf16 matmul) took 0.60 ms a block, 0.13 ms
of it `torch.softmax` and 0.08 ms the float32 copy, scale and mask passes; torch's fused bf16
flash kernel 0.85 ms. Here: 0.41 ms (0.37 the primitives, 0.03 copying Q, K and V dense:
oneDNN's brgemm matmul wants dense batch axes and runs a strided view through its `gemm:jit`
fallback, 2x slower). In BERT-base at bf16 the 12 blocks took 6.3 ms of a run against 8.9.

Numbers: the scores stay in float32 from the accumulator through scale and mask to the softmax
(the bf16 program rounds them to bf16 before scaling), so the block is at least as close to the
float32 model as the bf16 program's reference; the probabilities are rounded to bf16 once for
the second product, as there.

The primitives depend on the operands' layouts, the mask's and the thread count (oneDNN splits
a primitive's work for the threads it was made for), so a block makes a `Plan` at its first call
with a new signature of its operands; plans and primitives live in a table shared by a
program's blocks (a model's layers share one set of primitives, with one float32 score and one
probability buffer). Operands the primitives do not take (a broadcast batch axis, mixed types)
go to the caller's fallback, torch's route.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from ctypes import POINTER, Array, byref, c_float, c_int, c_void_p

import torch

from pygraphx.targets.torch_lowering.onednn_capi import (
    ARG_DST,
    ARG_SRC,
    ARG_SRC_1,
    ARG_WEIGHTS,
    BF16,
    BINARY_ADD,
    F32,
    FORWARD_INFERENCE,
    Dims,
    ExecArg,
    OneDnnError,
    Runtime,
    check,
    post_op_arg,
    release,
    runtime,
)

log = logging.getLogger("pygraphx.cpu")
Tensor = torch.Tensor
empty_strided, get_num_threads = torch.empty_strided, torch.get_num_threads
#: oneDNN 3.x's `dnnl_eltwise_linear` (alpha * x + beta) and `dnnl_softmax_accurate`
ELTWISE_LINEAR = 0x26
SOFTMAX_ACCURATE = 0x30000
#: torch dtype -> oneDNN data type, for operands and mask
DTYPES = {torch.float32: F32, torch.bfloat16: BF16}
#: the key in an `attend` table of its plans (signature -> `Plan`, or None: the fallback)
PLANS = "plans"

_P = c_void_p
#: the C API functions used here beyond `onednn_capi`'s (name -> argtypes; all return status)
_SIGNATURES = {
    "dnnl_memory_desc_create_with_strides": [POINTER(_P), c_int, Dims, c_int, Dims],
    "dnnl_matmul_primitive_desc_create": [POINTER(_P), _P, _P, _P, _P, _P, _P],
    "dnnl_softmax_forward_primitive_desc_create": [
        POINTER(_P), _P, c_int, c_int, _P, _P, c_int, _P
    ],
}  # fmt: skip


def _declare(rt: Runtime) -> None:
    """Set the signatures of the functions this module calls (once per library)."""
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(rt.lib, name)
        fn.restype, fn.argtypes = c_int, argtypes


Layout = tuple[tuple[int, ...], tuple[int, ...]]
#: (q, kt, v, mask (or None)) layouts, the operand and mask types, the scale, the threads
Key = tuple


def dense_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of `dims`."""
    strides, step = [], 1
    for n in reversed(dims):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _token_major(dims: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a (..., heads, s, d) output laid out as (..., s, heads, d): the layout the
    model's next steps (transpose to (..., s, heads, d), reshape to (..., s, heads * d)) then
    only view, where a dense output is copied by that reshape (BERT-base at batch 8: 12 copies
    of 1.5 MB a run). Dense strides for fewer than four axes."""
    if len(dims) < 4:
        return dense_strides(dims)
    swapped = dense_strides((*dims[:-3], dims[-2], dims[-3], dims[-1]))
    return (*swapped[:-3], swapped[-2], swapped[-3], swapped[-1])


class Descs:
    """Memory descriptors made through one `Runtime` and destroyed with this object."""

    def __init__(self, rt: Runtime) -> None:
        self.rt, self.made = rt, []

    def __call__(self, dims: tuple[int, ...], strides: tuple[int, ...], kind: int) -> c_void_p:
        """A descriptor of `dims` with `strides` (a size-1 axis's stride is not read)."""
        dense = dense_strides(dims)
        strides = tuple(d if n == 1 else s for s, d, n in zip(strides, dense, dims, strict=True))
        md = c_void_p()
        status = self.rt.lib.dnnl_memory_desc_create_with_strides(
            byref(md), len(dims), Dims(*dims), kind, Dims(*strides)
        )
        check(status, f"memory_desc_create_with_strides{dims}{strides}")
        self.made.append(md)
        return md

    def __del__(self) -> None:
        release(self.rt.lib, [], None, None, self.made)


class Primitives:
    """The block's three primitives for one `Key`, their memory objects and the float32 score
    and probability buffers (the oneDNN objects are destroyed with it)."""

    def __init__(self, rt: Runtime, key: Key) -> None:
        (q, kt, v, mask), (dtype, mask_dtype), scale, _threads = key
        self.rt = rt
        self._descs = Descs(rt)
        self._mems: list[c_void_p] = []
        self._pds: list[c_void_p] = []
        self._prims: list[c_void_p] = []
        kind = DTYPES[dtype]
        scores = (*q[0][:-1], kt[0][-1])
        out = (*q[0][:-1], v[0][-1])
        self.out_shape, self.out_strides = out, _token_major(out)
        self.scores = torch.empty(scores, dtype=torch.float32)
        # float32 probabilities overwrite their scores (in-place softmax: half the cache)
        self.probs = self.scores if dtype == torch.float32 else torch.empty(scores, dtype=dtype)
        s_md, p_md = self._md(scores, kind=F32), self._md(scores, kind=kind)
        q_md, kt_md, v_md = (
            self._md(*q, kind=kind),
            self._md(*kt, kind=kind),
            self._md(*v, kind=kind),
        )
        o_md = self._md(out, self.out_strides, kind=kind)
        mask_md = None if mask is None else self._md(*mask, kind=DTYPES[mask_dtype])
        mm1 = self._matmul(q_md, kt_md, s_md, scale, mask_md)
        soft = self._softmax(s_md, p_md, len(scores) - 1)
        mm2 = self._matmul(p_md, v_md, o_md, 1.0, None)
        self.impls = [rt.impl_name(pd) for pd in self._pds]
        s_mem, p_mem = self._memory(s_md, self.scores), self._memory(p_md, self.probs)
        self.q, self.kt, self.v = self._memory(q_md), self._memory(kt_md), self._memory(v_md)
        self.out = self._memory(o_md)
        self.mask = None if mask_md is None else self._memory(mask_md)
        first = [(ARG_SRC, self.q), (ARG_WEIGHTS, self.kt), (ARG_DST, s_mem)]
        if self.mask is not None:
            mask_op = 1 if scale != 1.0 else 0  # the binary add follows the scale's post-op
            first.append((post_op_arg(mask_op, ARG_SRC_1), self.mask))
        steps = [
            (mm1, first),
            (soft, [(ARG_SRC, s_mem), (ARG_DST, p_mem)]),
            (mm2, [(ARG_SRC, p_mem), (ARG_WEIGHTS, self.v), (ARG_DST, self.out)]),
        ]
        self.steps = [(prim, len(pairs), _args(pairs)) for prim, pairs in steps]

    def _md(self, dims: tuple[int, ...], strides: tuple[int, ...] = (), *, kind: int) -> c_void_p:
        return self._descs(dims, strides or dense_strides(dims), kind)

    def _memory(self, md: c_void_p, buffer: Tensor | None = None) -> c_void_p:
        mem = self.rt.memory(md, None if buffer is None else buffer.data_ptr())
        self._mems.append(mem)
        return mem

    def _matmul(
        self, a: c_void_p, b: c_void_p, dst: c_void_p, scale: float, mask: c_void_p | None
    ) -> c_void_p:
        """A matmul primitive `dst = scale * (a @ b) (+ mask)`."""
        lib = self.rt.lib
        attr, post_ops = c_void_p(), c_void_p()
        check(lib.dnnl_primitive_attr_create(byref(attr)), "primitive_attr_create")
        check(lib.dnnl_post_ops_create(byref(post_ops)), "post_ops_create")
        try:
            if scale != 1.0:  # before the mask, as the block computes it
                linear = lib.dnnl_post_ops_append_eltwise(
                    post_ops, ELTWISE_LINEAR, c_float(scale), c_float(0.0)
                )
                check(linear, "post-op linear (the scale)")
            if mask is not None:
                check(lib.dnnl_post_ops_append_binary(post_ops, BINARY_ADD, mask), "mask add")
            check(lib.dnnl_primitive_attr_set_post_ops(attr, post_ops), "set_post_ops")
            pd = c_void_p()
            status = lib.dnnl_matmul_primitive_desc_create(
                byref(pd), self.rt.engine, a, b, None, dst, attr
            )
            check(status, "attention matmul primitive_desc_create")
        finally:
            lib.dnnl_primitive_attr_destroy(attr)
            lib.dnnl_post_ops_destroy(post_ops)
        return self._primitive(pd)

    def _softmax(self, src: c_void_p, dst: c_void_p, axis: int) -> c_void_p:
        pd = c_void_p()
        status = self.rt.lib.dnnl_softmax_forward_primitive_desc_create(
            byref(pd), self.rt.engine, FORWARD_INFERENCE, SOFTMAX_ACCURATE, src, dst, axis, None
        )
        check(status, "attention softmax primitive_desc_create")
        return self._primitive(pd)

    def _primitive(self, pd: c_void_p) -> c_void_p:
        self._pds.append(pd)
        prim = self.rt.primitive(pd)
        self._prims.append(prim)
        return prim

    def run(self, q: int, kt: int, v: int, mask: int | None) -> Tensor:
        """The block's output, a new tensor, for operands (addresses) of this key's layouts."""
        lib = self.rt.lib
        set_handle, execute, stream = (
            lib.dnnl_memory_set_data_handle,
            lib.dnnl_primitive_execute,
            self.rt.stream,
        )
        out = empty_strided(self.out_shape, self.out_strides, dtype=self.probs.dtype)
        set_handle(self.q, q)
        set_handle(self.kt, kt)
        set_handle(self.v, v)
        set_handle(self.out, out.data_ptr())
        if mask is not None:
            set_handle(self.mask, mask)
        for prim, n, args in self.steps:
            status = execute(prim, stream, n, args)
            if status:
                check(status, "attention execute")
        return out

    def __del__(self) -> None:
        lib = self.rt.lib
        release(lib, self._mems, None, None)
        for prim, pd in zip(self._prims, self._pds, strict=False):
            release(lib, [], prim, pd)


def _args(pairs: list[tuple[int, c_void_p]]) -> Array:
    """The `dnnl_exec_arg_t` array of (argument index, memory) pairs."""
    return (ExecArg * len(pairs))(*(ExecArg(a, m) for a, m in pairs))


def _supported(q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None) -> bool:
    """Whether the primitives take these operands: one type, the same batch axes, no
    broadcast (stride 0) or negative strides, a float32 / bf16 mask."""
    ts = (q, kt, v)
    if q.dtype not in DTYPES or any(t.dtype != q.dtype or t.dim() != q.dim() for t in ts):
        return False
    if q.dim() < 2 or not (q.shape[:-2] == kt.shape[:-2] == v.shape[:-2]):
        return False
    if q.shape[-1] != kt.shape[-2] or kt.shape[-1] != v.shape[-2]:
        return False
    if any(s <= 0 and n > 1 for t in ts for s, n in zip(t.stride(), t.shape, strict=True)):
        return False
    if mask is None:
        return True
    return mask.dtype in DTYPES and mask.dim() <= q.dim() and min(mask.stride(), default=0) >= 0


def permuted_dense(t: Tensor) -> bool:
    """`t` fills its memory without gaps or overlaps, its axes in some order (axes of length 1
    aside)."""
    step = 1
    for axis in sorted((a for a in range(t.dim()) if t.shape[a] > 1), key=t.stride):
        if t.stride(axis) != step:
            return False
        step *= t.shape[axis]
    return True


class Operand:
    """Where the primitives read one operand: the tensor itself when its layout is one oneDNN's
    brgemm matmul takes at full speed, else a copy into a kept dense buffer (torch's copy was
    faster than a oneDNN reorder).

    brgemm takes dense batch axes, and (`permuted`) a dense tensor whose axes are permuted: the
    head view (b, h, s, d) of a (b, s, h * d) product of its own, as `lower_gemm` makes for the
    Q, K and V parts of a fused projection (`_emit_column_parts`). A head view of the fused
    (b, s, 3 * h * d) product has gaps between its rows: oneDNN then falls back to its `gemm:jit`
    matmul, 2x slower than copying first. `Plan` checks which matmul oneDNN took and copies
    where a permuted operand did not get brgemm. In BERT-base at batch 1 (one thread, process
    CPU time, the 2-core EPYC while others worked) the copies of the fused product's heads took
    1.3 ms a run, the whole attention 12.5 ms against 10.6 on the parts' own products."""

    def __init__(self, t: Tensor, transposed: bool = False, permuted: bool = False) -> None:
        dims = tuple(t.shape)
        if transposed:  # K^T: dense as K, the last two axes swapped
            base = dense_strides((*dims[:-2], dims[-1], dims[-2]))
            strides = (*base[:-2], base[-1], base[-2])
        else:
            strides = dense_strides(dims)
        self.buffer: Tensor | None = None
        self.permuted = False
        if all(s == d or n <= 1 for s, d, n in zip(t.stride(), strides, dims, strict=True)):
            self.layout = (dims, strides)
        elif permuted and permuted_dense(t):
            self.layout, self.permuted = (dims, tuple(t.stride())), True
        else:
            self.layout = (dims, strides)
            self.buffer = torch.empty_strided(dims, strides, dtype=t.dtype)

    def address(self, t: Tensor) -> int:
        """The address the primitives read `t` at (its copy's, after copying it)."""
        if self.buffer is None:
            return t.data_ptr()
        return self.buffer.copy_(t).data_ptr()


def compact(mask: Tensor, ndim: int) -> Tensor:
    """`mask` (a view) with its broadcast axes (stride 0) cut to length 1 and leading axes of
    length 1 up to `ndim` (the binary post-op broadcasts it over the scores)."""
    cut = mask[tuple(slice(0, 1) if s == 0 else slice(None) for s in mask.stride())]
    return cut.view((1,) * (ndim - cut.dim()) + tuple(cut.shape))


def _expand(mask: Tensor, shape: tuple[int, ...]) -> Tensor:
    """`mask` broadcast to the scores' whole `shape` (a view)."""
    return mask.expand(shape)


def _reference(prims: Primitives) -> bool:
    """oneDNN took its reference implementation for a primitive (orders of magnitude slower)."""
    return any(impl.startswith("ref") for impl in prims.impls)


class Plan:
    """How a block runs for one signature of its operands (shapes, strides, types, threads):
    the primitives (shared by every plan of their layouts) and the operands' copies.

    The mask is read at its compact size (`compact`) where oneDNN's fast matmul broadcasts it
    (one mask per batch entry, per query row or per head-free (s, t) block of a batch entry),
    else broadcast to the scores' whole shape and copied, once per call, into a dense buffer (a
    (s, t) mask shared by a batch of several: oneDNN would run its reference matmul). Operands
    that still get the reference matmul raise `OneDnnError`."""

    def __init__(self, rt: Runtime, table: dict, scale: float, operands: tuple) -> None:
        q, kt, v, mask = operands
        self.ndim = q.dim()
        scores = (*q.shape[:-1], kt.shape[-1])
        self.shape_mask: Callable[[Tensor], Tensor] = lambda m: compact(m, self.ndim)
        self._operands(q, kt, v, permuted=True)
        self.prims = self._primitives(rt, table, scale, (q, mask))
        slow = any(not impl.startswith("brg") for impl in self.prims.impls[::2])
        if slow and any(o.permuted for o in (self.q, self.kt, self.v)):
            table.pop(self.key)  # copy the permuted operands dense instead
            self._operands(q, kt, v, permuted=False)
            self.prims = self._primitives(rt, table, scale, (q, mask))
        if mask is not None and _reference(self.prims):
            table.pop(self.key)
            self.shape_mask = lambda m: _expand(m, scores)
            self.prims = self._primitives(rt, table, scale, (q, mask))
        if _reference(self.prims):
            table.pop(self.key)
            raise OneDnnError(f"attention {list(scores)}: oneDNN offers its reference matmul only")

    def _operands(self, q: Tensor, kt: Tensor, v: Tensor, permuted: bool) -> None:
        self.q, self.v = Operand(q, permuted=permuted), Operand(v, permuted=permuted)
        self.kt = Operand(kt, transposed=kt.stride()[-2] == 1, permuted=permuted)

    def _primitives(self, rt: Runtime, table: dict, scale: float, qm: tuple) -> Primitives:
        q, mask = qm
        self.mask = None if mask is None else Operand(self.shape_mask(mask))
        layouts = (self.q.layout, self.kt.layout, self.v.layout)
        key = (
            (*layouts, None if self.mask is None else self.mask.layout),
            (q.dtype, None if mask is None else mask.dtype),
            scale,
            torch.get_num_threads(),
        )
        if key not in table:
            table[key] = Primitives(rt, key)
        self.key = key
        return table[key]

    def run(self, q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """The block's output (a new tensor)."""
        m = None
        if self.mask is not None and mask is not None:  # a compact view starts where it does
            dense = self.mask.buffer is None
            m = mask.data_ptr() if dense else self.mask.address(self.shape_mask(mask))
        return self.prims.run(self.q.address(q), self.kt.address(kt), self.v.address(v), m)


Attend = Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor]


def _signature(q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None) -> tuple:
    """The operands' shapes, strides and types, and the thread count: what a `Plan` is for.

    Written out flat: in a model the block runs right after a weight product, its code out of
    the caches, where a generator over the operands cost ~20 us more (2-core EPYC, one thread,
    thread CPU time, `benchmarks/attn10_cold.py`)."""
    masked = None if mask is None else (mask.shape, mask.stride(), mask.dtype)
    return (q.shape, q.stride(), q.dtype, kt.shape, kt.stride(), kt.dtype, v.shape, v.stride(),
            v.dtype, masked, get_num_threads())  # fmt: skip


def _plan(rt: Runtime, table: dict, scale: float, operands: tuple) -> Plan | None:
    """The plan for these operands, or None (the fallback runs them: said once per signature
    oneDNN refused, on the `pygraphx.cpu` logger at WARNING)."""
    if not _supported(*operands):
        return None
    try:
        return Plan(rt, table, scale, operands)
    except OneDnnError as exc:
        shapes = [tuple(t.shape) for t in operands if t is not None]
        log.warning("cpu attention %s: torch's matmul / softmax / matmul instead of oneDNN (%s)",
                    shapes, exc)  # fmt: skip
        return None


def attend(scale: float, table: dict, fallback: Attend) -> Attend:
    """A block function `(q, kt, v, mask) -> out` running the primitives kept in `table` (a
    dict shared by the program's blocks, holding their plans and primitives); operands they do
    not take go to `fallback`."""
    rt = runtime()
    if rt is None:
        return fallback
    _declare(rt)
    plans = table.setdefault(PLANS, {})

    def run(q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        sig = (_signature(q, kt, v, mask), scale)
        plan = plans.get(sig, False)
        if plan is False:
            plan = plans[sig] = _plan(rt, table, scale, (q, kt, v, mask))
        if plan is None:
            return fallback(q, kt, v, mask)
        return plan.run(q, kt, v, mask)

    return run


def available() -> bool:
    """Whether oneDNN's C API library is loaded (see `onednn_capi.library`)."""
    return runtime() is not None


__all__ = ["Primitives", "attend", "available"]
