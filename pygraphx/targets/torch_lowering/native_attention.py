"""An attention block on the CPU as one native kernel (`native/kernels/attention.c`, its float32
variant in `attention_f32.c`, built as one source):
`attention.py` runs it first for bf16 blocks (oneDNN's three primitives, `onednn_attention.py`,
where it does not take the operands) and for float32 blocks of 32K scores or more (an FMA
variant; their torch / oneDNN route as the fallback).

The kernel works per (batch, head, block of `ROWS` query rows) with the block's scores kept in
the cache: S = Q K^T (bf16 products summed in float32 by `vdpbf16ps`), scale and additive mask
in float32, the row softmax in float32, the exponentials rounded to bf16 once, O = P V (float32
sums) times 1 / the sum of the rounded exponentials (so the weights applied sum to one; attn15:
MiniLM's error 5.21e-3 -> 4.92e-3 on the zoo's sentences, `benchmarks/results/attn15.md`;
`ROUNDED_SUM_ENV=0`: of the unrounded ones, the first version), the output rounded to bf16 once
and written token-major ((b, s, h, d) memory for a (b, h, s, d) result, as the oneDNN route
does, so the model's transpose / reshape to (b, s, h * d) only views it). These are the oneDNN
route's roundings (float32 scores, bf16 probabilities, one output rounding); what it saves is
writing the scores and probabilities to memory between three primitives (BERT-base / MiniLM /
ViT figures in `benchmarks/results/attn13.md`).

It takes: bf16 or float32 Q (..., s, d), K^T (..., d, t) and V (..., t, d) of one type with
three or four axes, the same leading axes, d even for bf16, the last axis of Q and V and the d
axis of K^T dense (the strided head views of a fused QKV product are read in place, no copy),
non-negative strides; a float32 or bf16 additive mask broadcastable to the scores (read in
place where its key axis is dense or broadcast, else copied dense at each call). Anything else
goes to the fallback, said once per refused signature (INFO, the reason named).
`PGX_CPU_NATIVE_ATTENTION=0` keeps every block on the fallback; where the kernel cannot be had
(no C compiler, `PGX_NATIVE=off`, a failed build, no AVX-512F for float32 / no AVX512_BF16 for
bf16) that is said once per operand type, naming the route that runs instead, and the fallback
runs. The library is bound once per process (`native.BoundLibrary`, as the other kernels): a
build that failed (or timed out under load) is kept for the process, said once, and not started
again for the next block or program; a new process tries again (`PGX_NATIVE=off` is not kept).

Causal blocks (`attend_causal`, gpt14): where the lowering knows the mask keeps exactly the
keys j <= i + offset of query row i (`attention.causal_offset`: GPT-2's literal lower
triangle), the kernel computes only the key blocks a block of `CAUSAL_ROWS` query rows sees and
reads no mask (GPT-2 s128: 0.6-0.7x a block's time), with the full kernel's numbers (masked
scores weigh exactly 0 there too). `PGX_CPU_NATIVE_ATTENTION_CAUSAL=0` keeps them on the full
kernel with the mask.

Scratch: the kernel's per-thread buffers are a `Scratch` of the caller's (one per program,
shared by its blocks, whose runs its lock serialises), grown when a plan needs more and kept
between calls, so no call maps fresh pages and no thread leaves memory behind.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from ctypes import c_double, c_int, c_int64, c_void_p

import torch

from pygraphx.ir.env import switch_on
from pygraphx.targets import native
from pygraphx.targets.torch_lowering.onednn_attention import _signature, _token_major

Tensor = torch.Tensor
Attend = Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor]
Causal = Callable[[Tensor, Tensor, Tensor], Tensor | None]
KERNEL = "attention"
#: the kernel's further source files (`native/kernels/<part>.c`, appended to attention.c): the
#: float32 variant
PARTS = ("attention_f32",)
#: `0` keeps every bf16 block on the oneDNN route (A/B measurements)
ENV = "PGX_CPU_NATIVE_ATTENTION"
#: query rows per block (the scores of one block: ROWS x t float32)
ROWS = 32
#: query rows per block of a causal block (`attend_causal`): finer blocks skip more of the
#: keys a block does not see (GPT-2's s128: 9/16 of the scores computed at 16 rows, 5/8 at
#: 32); one thread, thread CPU, us a call bf16 b1 / b8, float32 b1 / b8, rows 32 against 16:
#: 214 / 1964 / 369 / 3486 against 199 / 1859 / 349 / 3417 (`benchmarks/results/gpt14.md`)
CAUSAL_ROWS = 16
#: the kernel's parameter array layout (`enum` in attention.c)
FIELDS = (
    "B H S T D QB QH QS KB KH KT VB VH VT MB MH MS MT MKIND OB OH OS THREADS ROWS TILES CAUSAL "
    "COFF SCRATCH SLOT"
).split()
_SCRATCH = FIELDS.index("SCRATCH")
#: `0` keeps causal blocks (`attend_causal`) on the full kernel: every key block computed, the
#: causal mask read (A/B measurements); read when a block is lowered
CAUSAL_ENV = "PGX_CPU_NATIVE_ATTENTION_CAUSAL"
#: `PGX_CPU_NATIVE_ATTENTION_TILES`: `wide` (the default: K packed by 16 x 16 transposes, bf16
#: pairs or floats; the float32 kernel's register tiles about 24 accumulators, 6 rows at 3-4
#: column vectors, 8 at 2, 12 at 1) or `4` (the first version: K packed element by element,
#: float32 tiles 4 rows at any width; bf16 tiles are 4 rows either way); read when a block is
#: lowered (`attend`)
TILES_ENV = "PGX_CPU_NATIVE_ATTENTION_TILES"


#: `0` divides a bf16 row's output by the sum of its unrounded exponentials (the first version)
#: rather than of the rounded weights it applies (the default); read when a block is lowered
#: (`kernel`: a build with `FIRST_FLAGS`, bound once per process beside the default one; a
#: build flag, as the two paths in one build cost 1-2 % of a block)
ROUNDED_SUM_ENV = "PGX_CPU_NATIVE_ATTENTION_ROUNDED_SUM"
FIRST_FLAGS = ("-DPGX_ATTN_RSUM=0",)


def rounded_sum() -> bool:
    """Whether bf16 rows are normalised by the sum of their rounded weights (`ROUNDED_SUM_ENV`)."""
    return switch_on(ROUNDED_SUM_ENV)


def wide_tiles() -> bool:
    """Whether the kernel takes its second version's K packing and float32 tiles (`TILES_ENV`)."""
    value = os.environ.get(TILES_ENV, "wide").strip().lower() or "wide"
    if value not in ("wide", "4"):
        raise ValueError(f"{TILES_ENV}={value!r}: expected wide or 4")
    return value == "wide"

#: the key in an `attend` table of its plans (signature -> `Plan`, or None: the fallback)
PLANS = "native_plans"
#: the key in an `attend` table of the kernel's scratch (a `Scratch`)
SCRATCH = "native_scratch"
_MASK_KINDS = {torch.float32: 1, torch.bfloat16: 2}

#: the kernel's C function per operand type
_FUNCTIONS = {torch.bfloat16: "pgx_attention_bf16", torch.float32: "pgx_attention_f32"}
#: `pgx_attention_supported()`'s bit per operand type, and the instruction set it needs
_BITS = {torch.float32: (1, "AVX-512F"), torch.bfloat16: (2, "AVX-512 BF16")}
#: the kernel's failure statuses
_STATUS = {
    -1: "no scratch (or too little) given",
    -2: "bad parameters",
    -3: "built without the instruction set",
}
log = logging.getLogger("pygraphx.cpu")
_REFUSED: set[tuple] = set()


def enabled() -> bool:
    """Whether blocks may take the native kernel (`ENV` is not off)."""
    return switch_on(ENV)


#: `0` gives a float32 block's output a new tensor each run instead of its arena slot (helper
#: tfov17; see `attention.py`'s `_slot`)
SLOT_ENV = "PGX_CPU_ATTENTION_SLOT"


def slot_enabled() -> bool:
    return switch_on(SLOT_ENV)


def f32_available() -> bool:
    """Whether the float32 variant can be had (built, bound, the instruction set there); says
    nothing (`attend` announces a failure once when it asks)."""
    try:
        kernel(torch.float32)
    except native.NativeUnavailable:
        return False
    return True


def out_layout(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of the kernel's output of `shape` (q's shape with d values a row): token
    major, (b, s, h, d) in memory, so that the heads merge back without a copy."""
    return _token_major(shape)


def causal_enabled() -> bool:
    """Whether causal blocks may skip the key blocks they do not see (`CAUSAL_ENV` not off)."""
    return switch_on(CAUSAL_ENV)


def _bind(lib: ctypes.CDLL) -> None:
    """Check the parameter layout and set the kernel functions' argument types."""
    for name in ("pgx_attention_params", "pgx_attention_supported"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [], c_int
    if lib.pgx_attention_params() != len(FIELDS):
        raise native.NativeUnavailable(f"native kernel {KERNEL}: parameter layout mismatch")
    for name in _FUNCTIONS.values():
        fn = getattr(lib, name)
        fn.restype = c_int
        fn.argtypes = [c_void_p, c_double] + [c_void_p] * 5
        fn.scratch_bytes = lib.pgx_attention_scratch
    lib.pgx_attention_scratch.restype = c_int64
    lib.pgx_attention_scratch.argtypes = [c_void_p, c_int]


#: the library, bound once; a failed build is kept for the process (`native.BoundLibrary`)
_BOUND = native.BoundLibrary(KERNEL, _bind, parts=PARTS)
#: the first version's build (`ROUNDED_SUM_ENV=0`), bound once when asked for
_BOUND_FIRST = native.BoundLibrary(KERNEL, _bind, FIRST_FLAGS, parts=PARTS)


def kernel(dtype: torch.dtype = torch.bfloat16, extra_flags: tuple[str, ...] = (),
           rsum: bool | None = None) -> Callable:
    """The kernel's bound ctypes function for `dtype` operands; raises
    `native.NativeUnavailable` saying why it cannot be had (no build: the first failure again,
    for the rest of the process; no such instruction set in this build). The first version's
    build where `rsum` is False (default: where `ROUNDED_SUM_ENV` is off). `extra_flags`
    (tests): a build with these compiler flags, bound afresh, nothing kept."""
    if dtype not in _FUNCTIONS:
        raise native.NativeUnavailable(f"native kernel {KERNEL}: no variant for {dtype}")
    first = not (rounded_sum() if rsum is None else rsum)
    bound = _BOUND_FIRST if first else _BOUND
    if extra_flags:
        flags = (*(FIRST_FLAGS if first else ()), *extra_flags)
        bound = native.BoundLibrary(KERNEL, _bind, flags, PARTS)
    lib = bound.get()
    bit, isa = _BITS[dtype]
    if not lib.pgx_attention_supported() & bit:
        raise native.NativeUnavailable(
            f"native kernel {KERNEL}: built without {isa} (this processor lacks it), "
            f"no {dtype} variant")  # fmt: skip
    return getattr(lib, _FUNCTIONS[dtype])


class Scratch:
    """The kernel's scratch (bytes, 64-aligned), grown when asked for more, kept between calls;
    one per program (its runs are serialised by its lock). `lock`: held by the call using it; a
    call that finds it taken (plans run from several threads outside a program) uses a scratch
    of its own for that call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buf: Tensor | None = None
        self.address = 0
        self.size = 0

    def at_least(self, size: int) -> int:
        """The address of at least `size` bytes."""
        if size > self.size:
            self.buf = torch.empty(size + 64, dtype=torch.uint8)
            self.address = (self.buf.data_ptr() + 63) // 64 * 64
            self.size = size
        return self.address


def refusal(q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None) -> str | None:
    """Why the kernel does not take these operands, or None where it does (see the module
    docstring)."""
    ts = (q, kt, v)
    if q.dtype not in _FUNCTIONS:
        return f"operand type {q.dtype}"
    if q.dim() not in (3, 4) or any(t.dtype != q.dtype or t.dim() != q.dim() for t in ts):
        return "operand types or axis counts differ, or not 3 / 4 axes"
    if not (q.shape[:-2] == kt.shape[:-2] == v.shape[:-2]):
        return "leading axes differ"
    d, t = q.shape[-1], kt.shape[-1]
    if d % 2 and q.dtype == torch.bfloat16:
        return f"odd d ({d}) for bf16"
    if d != kt.shape[-2] or t != v.shape[-2] or v.shape[-1] != d or t < 1:
        return "shapes do not match"
    if q.stride(-1) != 1 or kt.stride(-2) != 1 or v.stride(-1) != 1:
        return "the d axis of Q, K^T or V not dense"
    if any(s < 0 for x in ts for s in x.stride()):
        return "negative stride"
    if mask is None:
        return None
    if mask.dtype not in _MASK_KINDS:
        return f"mask type {mask.dtype}"
    if mask.dim() > q.dim() or min(mask.stride(), default=0) < 0:
        return "mask has more axes or a negative stride"
    try:
        mask.expand((*q.shape[:-1], t))
    except RuntimeError:
        return "mask not broadcastable to the scores"
    return None


def supported(q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None) -> bool:
    """Whether the kernel takes these operands (see the module docstring)."""
    return refusal(q, kt, v, mask) is None


def _strided_keys(mask: Tensor, t: int) -> bool:
    """The mask's key axis is neither dense nor broadcast: the kernel reads a dense copy."""
    return t > 1 and mask.shape[-1] == t and mask.stride(-1) not in (0, 1)


class Plan:
    """The kernel's parameters for one operand signature, and the output's layout."""

    def __init__(self, fn: Callable, scale: float, q: Tensor, kt: Tensor, v: Tensor,
                 mask: Tensor | None, threads: int, scratch: Scratch | None = None,
                 tiles: bool = True, causal: int | None = None,
                 rows: int | None = None) -> None:  # fmt: skip
        s, d, t = q.shape[-2], q.shape[-1], kt.shape[-1]
        self.scratch = Scratch() if scratch is None else scratch
        self.dtype = q.dtype
        out = (*q.shape[:-1], d)
        self.out_shape, self.out_strides = out, _token_major(out)

        def lead(strides: tuple[int, ...]) -> tuple[int, int]:
            return (strides[0], strides[1]) if q.dim() == 4 else (0, strides[0])

        b, h = (q.shape[0], q.shape[1]) if q.dim() == 4 else (1, q.shape[0])
        vals = dict(B=b, H=h, S=s, T=t, D=d, THREADS=threads, ROWS=rows or ROWS, TILES=int(tiles),
                    CAUSAL=int(causal is not None), COFF=causal or 0)  # fmt: skip
        vals.update(zip(("QB", "QH"), lead(q.stride()), strict=True), QS=q.stride(-2))
        vals.update(zip(("KB", "KH"), lead(kt.stride()), strict=True), KT=kt.stride(-1))
        vals.update(zip(("VB", "VH"), lead(v.stride()), strict=True), VT=v.stride(-2))
        vals.update(zip(("OB", "OH"), lead(self.out_strides), strict=True),
                    OS=self.out_strides[-2])  # fmt: skip
        self.copy_mask = mask is not None and _strided_keys(mask, t)
        if mask is None:
            vals.update(MB=0, MH=0, MS=0, MT=0, MKIND=0)
        else:
            mask = mask.contiguous() if self.copy_mask else mask
            full = mask.expand((*q.shape[:-1], t)).stride()
            vals.update(zip(("MB", "MH"), lead(full), strict=True), MS=full[-2],
                        MT=full[-1] if t > 1 else 0, MKIND=_MASK_KINDS[mask.dtype])  # fmt: skip
        vals.update(SCRATCH=0, SLOT=0)
        self.params = (c_int64 * len(FIELDS))(*(int(vals[f]) for f in FIELDS))
        slot = fn.scratch_bytes(self.params, int(q.dtype == torch.float32))
        self.params[FIELDS.index("SLOT")] = slot
        self.need = slot * threads
        self.fn, self.scale = fn, float(scale)
        self.sizes = f"B={b} H={h} S={s} T={t} D={d} {q.dtype}, {threads} thread(s)"
        if causal is not None:
            self.sizes += f", causal (offset {causal})"

    def run(self, q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None,
            out: Tensor | None = None) -> Tensor:  # fmt: skip
        """The block's output: written into `out` (the plan's shape, strides and type: an arena
        slot, `attention.py`'s `_slot`) where given, else a new tensor."""
        if out is None:
            out = torch.empty_strided(self.out_shape, self.out_strides, dtype=self.dtype)
        elif (tuple(out.shape) != self.out_shape or out.stride() != self.out_strides
              or out.dtype != self.dtype):  # fmt: skip
            raise ValueError(
                f"native attention: output {tuple(out.shape)} {out.stride()} {out.dtype}, the "
                f"plan writes {self.out_shape} {self.out_strides} {self.dtype}")
        if mask is not None and self.copy_mask:
            mask = mask.contiguous()  # kept alive until the call returns
        m = None if mask is None else mask.data_ptr()
        ptrs = (q.data_ptr(), kt.data_ptr(), v.data_ptr(), m, out.data_ptr())
        lock = self.scratch.lock
        if lock.acquire(blocking=False):
            try:
                params = self.params
                params[_SCRATCH] = self.scratch.at_least(self.need)
                status = self.fn(params, self.scale, *ptrs)
            finally:
                lock.release()
        else:  # another thread runs on this scratch (plans shared outside a program's lock)
            params = (c_int64 * len(FIELDS))(*self.params)
            spare = Scratch()
            params[_SCRATCH] = spare.at_least(self.need)
            status = self.fn(params, self.scale, *ptrs)
        if status:
            what = _STATUS.get(status, "unknown status")
            raise RuntimeError(
                f"native attention kernel failed (status {status}: {what}; {self.sizes}, "
                f"scratch {self.need} bytes at {params[_SCRATCH]:#x})")
        return out


def _variant(dtype: torch.dtype, route: str, rsum: bool) -> Callable | None:
    """The kernel for `dtype` operands (the `rsum` build, read at lowering), or None (said once
    per type)."""
    try:
        return kernel(dtype, rsum=rsum)
    except native.NativeUnavailable as exc:
        native.announce_fallback(f"{KERNEL} ({dtype})", exc, route)
        return None


def attend(scale: float, table: dict, fallback: Attend, dtype: torch.dtype = torch.bfloat16,
           route: str = "the oneDNN attention route", out: Tensor | None = None) -> Attend:
    """A block function `(q, kt, v, mask) -> out` running the native kernel for the operands
    it takes (plans and scratch kept in `table`, shared by a program's blocks) and `fallback`
    (named `route`) for the rest; `fallback` itself where the kernel's `dtype` variant cannot
    be had (said once per operand type). Operands of the other type take their variant where it
    is had. With `out` (a fixed tensor of the kernel's layout, `out_layout`: an arena slot),
    every result lands in `out` and `out` is returned: the kernel writes it, another route's
    result is copied into it. `attention._slot` gives the slot at lowering time, before the
    operands are seen: a block whose operands the kernel refuses at run time (`refusal`: a
    d axis that is not dense, a mask type it does not take) keeps the slot, and every run
    then pays a copy of the fallback's result into it (said once per operand signature, as any
    refusal; review17c)."""
    tiles, rsum = wide_tiles(), rounded_sum()
    fn = _variant(dtype, route, rsum)
    if fn is None:
        if out is None:
            return fallback

        def copied(q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
            return out.copy_(fallback(q, kt, v, mask))

        return copied
    plans = table.setdefault(PLANS, {})
    scratch = table.setdefault(SCRATCH, Scratch())
    get_num_threads = torch.get_num_threads

    def run(q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        sig = (_signature(q, kt, v, mask), scale, tiles, rsum)
        plan = plans.get(sig, False)
        if plan is False:
            why = refusal(q, kt, v, mask)
            use = fn if q.dtype == dtype or why else _variant(q.dtype, route, rsum)
            why = why or (None if use else f"no {q.dtype} variant")
            threads = get_num_threads()
            plan = None if why else Plan(use, scale, q, kt, v, mask, threads, scratch, tiles)
            plans[sig] = plan
            if why and sig not in _REFUSED:
                _REFUSED.add(sig)
                log.info("native attention kernel: %s (q %s, k^t %s, v %s, mask %s); %s runs",
                         why, tuple(q.shape), tuple(kt.shape), tuple(v.shape),
                         None if mask is None else tuple(mask.shape), route)  # fmt: skip
        if plan is None:
            y = fallback(q, kt, v, mask)
            return y if out is None else out.copy_(y)
        return plan.run(q, kt, v, mask, out)

    return run


def attend_causal(scale: float, table: dict, dtype: torch.dtype, offset: int,
                  route: str = "the full kernel",
                  out: Tensor | None = None) -> Causal | None:  # fmt: skip
    """A causal block function `(q, kt, v) -> out`: query row i attends to keys j <= i +
    `offset` only (`offset` >= 0; the kernel skips the key blocks a query block does not see and
    reads no mask), or None where the operands are refused (said once, as `attend` does; the
    caller then runs its full route with the causal mask). None in place of the function where
    the kernel's `dtype` variant cannot be had or `CAUSAL_ENV` is off. Plans and scratch are
    `attend`'s (`table`); `out` as `attend`'s (the kernel writes it)."""
    if offset < 0 or not causal_enabled():
        return None
    tiles, rsum = wide_tiles(), rounded_sum()
    fn = _variant(dtype, route, rsum)
    if fn is None:
        return None
    plans = table.setdefault(PLANS, {})
    scratch = table.setdefault(SCRATCH, Scratch())
    get_num_threads = torch.get_num_threads

    def run(q: Tensor, kt: Tensor, v: Tensor) -> Tensor | None:
        sig = (_signature(q, kt, v, None), scale, tiles, rsum, "causal", offset)
        plan = plans.get(sig, False)
        if plan is False:
            why = refusal(q, kt, v, None)
            use = fn if q.dtype == dtype or why else _variant(q.dtype, route, rsum)
            why = why or (None if use else f"no {q.dtype} variant")
            threads = get_num_threads()
            plan = None if why else Plan(use, scale, q, kt, v, None, threads, scratch, tiles,
                                         causal=offset, rows=CAUSAL_ROWS)  # fmt: skip
            plans[sig] = plan
            if why and sig not in _REFUSED:
                _REFUSED.add(sig)
                log.info("native attention kernel (causal): %s (q %s, k^t %s, v %s); %s runs",
                         why, tuple(q.shape), tuple(kt.shape), tuple(v.shape), route)
        return None if plan is None else plan.run(q, kt, v, None, out)

    return run


__all__ = ["CAUSAL_ENV", "ENV", "ROUNDED_SUM_ENV", "SLOT_ENV", "Scratch", "attend",
           "attend_causal", "causal_enabled", "enabled", "f32_available", "kernel",
           "out_layout", "refusal", "rounded_sum", "slot_enabled", "supported"]  # fmt: skip
