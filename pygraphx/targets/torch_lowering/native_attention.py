"""An attention block on the CPU as one native kernel (`native/kernels/attention.c`):
`attention.py` runs it first for bf16 blocks (oneDNN's three primitives, `onednn_attention.py`,
where it does not take the operands) and for float32 blocks of 32K scores or more (an FMA
variant; their torch / oneDNN route as the fallback).

The kernel works per (batch, head, block of `ROWS` query rows) with the block's scores kept in
the cache: S = Q K^T (bf16 products summed in float32 by `vdpbf16ps`), scale and additive mask
in float32, the row softmax in float32, the exponentials rounded to bf16 once, O = P V times
1 / the row's sum, the output rounded to bf16 and written token-major ((b, s, h, d) memory for a
(b, h, s, d) result, as the oneDNN route does, so the model's transpose / reshape to
(b, s, h * d) only views it). These are the oneDNN route's numbers (float32 scores, bf16
probabilities); what it saves is writing the scores and probabilities to memory between three
primitives (BERT-base / MiniLM / ViT figures in `benchmarks/results/attn13.md`).

It takes: bf16 or float32 Q (..., s, d), K^T (..., d, t) and V (..., t, d) of one type with
three or four axes, the same leading axes, d even for bf16, the last axis of Q and V and the d
axis of K^T dense (the strided head views of a fused QKV product are read in place, no copy),
non-negative strides; a float32 or bf16 additive mask broadcastable to the scores (read in
place where its key axis is dense or broadcast, else copied dense at each call). Anything else
goes to the fallback. `PGX_CPU_NATIVE_ATTENTION=0` keeps every block on the fallback; where the
kernel cannot be built (no C compiler, `PGX_NATIVE=off`, no AVX512_BF16) that is said once and
the fallback runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from ctypes import c_double, c_int, c_int64, c_void_p

import torch

from pygraphx.targets import native
from pygraphx.targets.torch_lowering.onednn_attention import _signature, _token_major

Tensor = torch.Tensor
Attend = Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor]
KERNEL = "attention"
#: `0` keeps every bf16 block on the oneDNN route (A/B measurements)
ENV = "PGX_CPU_NATIVE_ATTENTION"
#: query rows per block (the scores of one block: ROWS x t float32)
ROWS = 32
#: the kernel's parameter array layout (`enum` in attention.c)
FIELDS = ("B H S T D QB QH QS KB KH KT VB VH VT MB MH MS MT MKIND OB OH OS THREADS ROWS "
          "TILES").split()
#: `PGX_CPU_NATIVE_ATTENTION_TILES`: `wide` (the default: K packed by 16 x 16 transposes, bf16
#: pairs or floats; the float32 kernel's register tiles about 24 accumulators, 6 rows at 3-4
#: column vectors, 8 at 2, 12 at 1) or `4` (the first version: K packed element by element,
#: float32 tiles 4 rows at any width; bf16 tiles are 4 rows either way); read when a block is
#: lowered (`attend`)
TILES_ENV = "PGX_CPU_NATIVE_ATTENTION_TILES"


def wide_tiles() -> bool:
    """Whether the kernel takes its second version's K packing and float32 tiles (`TILES_ENV`)."""
    value = os.environ.get(TILES_ENV, "wide").strip().lower() or "wide"
    if value not in ("wide", "4"):
        raise ValueError(f"{TILES_ENV}={value!r}: expected wide or 4")
    return value == "wide"

#: the key in an `attend` table of its plans (signature -> `Plan`, or None: the fallback)
PLANS = "native_plans"
_MASK_KINDS = {torch.float32: 1, torch.bfloat16: 2}

#: the kernel's C function per operand type
_FUNCTIONS = {torch.bfloat16: "pgx_attention_bf16", torch.float32: "pgx_attention_f32"}
_kernels: dict[torch.dtype, Callable] = {}
_why: native.NativeUnavailable | None = None


def enabled() -> bool:
    """Whether blocks may take the native kernel (`ENV` is not off)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def kernel(dtype: torch.dtype = torch.bfloat16) -> Callable:
    """The kernel's bound ctypes function for `dtype` operands; raises
    `native.NativeUnavailable` saying why it cannot be had."""
    global _why
    fn = _kernels.get(dtype)
    if fn is not None:
        return fn
    if _why is not None:
        raise _why
    try:
        lib = native.load(KERNEL)
        if not lib.pgx_attention_supported():
            raise native.NativeUnavailable(
                "native kernel attention: built without AVX-512 BF16 (this processor lacks it)")
        if lib.pgx_attention_params() != len(FIELDS):
            raise native.NativeUnavailable("native kernel attention: parameter layout mismatch")
    except native.NativeUnavailable as exc:
        _why = exc
        raise
    for dt, name in _FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype = c_int
        fn.argtypes = [c_void_p, c_double] + [c_void_p] * 5
        _kernels[dt] = fn
    return _kernels[dtype]


def supported(q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None) -> bool:
    """Whether the kernel takes these operands (see the module docstring)."""
    ts = (q, kt, v)
    if q.dtype not in _FUNCTIONS or q.dim() not in (3, 4):
        return False
    if any(t.dtype != q.dtype or t.dim() != q.dim() for t in ts):
        return False
    if not (q.shape[:-2] == kt.shape[:-2] == v.shape[:-2]):
        return False
    d, t = q.shape[-1], kt.shape[-1]
    if d % 2 and q.dtype == torch.bfloat16:
        return False
    if d != kt.shape[-2] or t != v.shape[-2] or v.shape[-1] != d or t < 1:
        return False
    if q.stride(-1) != 1 or kt.stride(-2) != 1 or v.stride(-1) != 1:
        return False
    if any(s < 0 for x in ts for s in x.stride()):
        return False
    if mask is None:
        return True
    if mask.dtype not in _MASK_KINDS or mask.dim() > q.dim() or min(mask.stride(), default=0) < 0:
        return False
    try:
        mask.expand((*q.shape[:-1], t))
    except RuntimeError:
        return False
    return True


def _strided_keys(mask: Tensor, t: int) -> bool:
    """The mask's key axis is neither dense nor broadcast: the kernel reads a dense copy."""
    return t > 1 and mask.shape[-1] == t and mask.stride(-1) not in (0, 1)


class Plan:
    """The kernel's parameters for one operand signature, and the output's layout."""

    def __init__(self, fn: Callable, scale: float, q: Tensor, kt: Tensor, v: Tensor,
                 mask: Tensor | None, threads: int, tiles: bool = True) -> None:
        s, d, t = q.shape[-2], q.shape[-1], kt.shape[-1]
        self.dtype = q.dtype
        out = (*q.shape[:-1], d)
        self.out_shape, self.out_strides = out, _token_major(out)

        def lead(strides: tuple[int, ...]) -> tuple[int, int]:
            return (strides[0], strides[1]) if q.dim() == 4 else (0, strides[0])

        b, h = (q.shape[0], q.shape[1]) if q.dim() == 4 else (1, q.shape[0])
        vals = dict(B=b, H=h, S=s, T=t, D=d, THREADS=threads, ROWS=ROWS, TILES=int(tiles))
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
        self.params = (c_int64 * len(FIELDS))(*(int(vals[f]) for f in FIELDS))
        self.fn, self.scale = fn, float(scale)

    def run(self, q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """The block's output (a new tensor)."""
        out = torch.empty_strided(self.out_shape, self.out_strides, dtype=self.dtype)
        if mask is not None and self.copy_mask:
            mask = mask.contiguous()  # kept alive until the call returns
        m = None if mask is None else mask.data_ptr()
        status = self.fn(self.params, self.scale, q.data_ptr(), kt.data_ptr(), v.data_ptr(), m,
                         out.data_ptr())  # fmt: skip
        if status:
            raise RuntimeError(f"native attention kernel failed (status {status})")
        return out


def attend(scale: float, table: dict, fallback: Attend) -> Attend:
    """A block function `(q, kt, v, mask) -> out` running the native kernel for the operands
    it takes (plans kept in `table`, shared by a program's blocks) and `fallback` for the rest;
    `fallback` itself where the kernel cannot be had (said once)."""
    try:
        kernel()
    except native.NativeUnavailable as exc:
        native.announce_fallback(KERNEL, exc, "the oneDNN attention route")
        return fallback
    plans = table.setdefault(PLANS, {})
    get_num_threads = torch.get_num_threads
    tiles = wide_tiles()

    def run(q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        sig = (_signature(q, kt, v, mask), scale, tiles)
        plan = plans.get(sig, False)
        if plan is False:
            ok = supported(q, kt, v, mask)
            threads = get_num_threads()
            plan = Plan(kernel(q.dtype), scale, q, kt, v, mask, threads, tiles) if ok else None
            plans[sig] = plan
        if plan is None:
            return fallback(q, kt, v, mask)
        return plan.run(q, kt, v, mask)

    return run


__all__ = ["ENV", "attend", "enabled", "kernel", "supported"]
