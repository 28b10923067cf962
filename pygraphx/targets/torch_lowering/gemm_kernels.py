"""The fixed-weight matrix products of the cpu target's `dot` lowerings (`lower_gemm.py`): the
weight as one 2-D matrix and the bias as one vector when they are constants, the packed weights
(oneDNN's and MKL's, made once per row count and kept in the lowering context), and the kernel
`gemm_select` chooses for a product, with the activation oneDNN fuses (`DNNL_EPILOGUES`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.ops.literal_views import wide_vector
from pygraphx.targets.torch_lowering import gemm_select, native_gemm, onednn_linear
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.malloc_keep import keep_freed_memory

#: `ctx.cache` key: id of a float32 constant-weight dot -> the kernel chosen for it
GEMM_KERNELS = "gemm_kernels"

Kernel = Callable[[torch.Tensor], torch.Tensor]


def batch_broadcast_matrix(ctx: LoweringContext, ins: Instruction, k: int) -> torch.Tensor | None:
    """Input k as one fixed 2-D matrix when it is the same matrix for every batch entry."""
    x = ins.inputs[k].shape
    t = ctx.constant(ctx.arg(ins, k))
    if t is None:
        return None
    if x.ndim() == 2:
        return t
    strides = x.strides()[:-2]
    if any(s != 0 for s, n in zip(strides, x.lens()[:-2], strict=True) if n != 1):
        return None
    return t[(0,) * (x.ndim() - 2)]


def bias_vector(ctx: LoweringContext, x: Instruction, n: int) -> torch.Tensor | None:
    """A fixed float32 input that varies along its last axis only, as an (n,) vector."""
    t = ctx.constant(ctx.index[id(x)])
    if t is None or t.dtype not in GEMM_DTYPES or t.dim() < 1 or t.shape[-1] != n:
        return None
    if any(s != 0 for s, m in zip(t.stride()[:-1], t.shape[:-1], strict=True) if m != 1):
        return None
    wide = wide_vector(x, n) if t.dtype == torch.bfloat16 else None
    if wide is not None:  # a bf16 program's bias, unrounded (`ops.literal_views.wide_vector`)
        return torch.from_numpy(wide.copy())
    return t[(0,) * (t.dim() - 1)].contiguous()


def _packed_weight(
    ctx: LoweringContext | None, ins: Instruction, w: torch.Tensor, rows: int
) -> Any:
    """MKL's packed form of the fixed (K, N) matrix `w` for `rows` x K inputs, made once (kept
    in `ctx.packed_weights`; made afresh with no `ctx`, for measuring)."""
    key = ("mkl_weight", id(ins.inputs[1]), rows)
    if ctx is None or key not in ctx.packed_weights:
        wt = w.t().contiguous()
        n, k = wt.shape
        packed = torch.ops.mkl._mkl_reorder_linear_weight(wt, rows)
        # the original weight is read only for other row counts, which static shapes rule out
        made = (packed, torch.zeros(1, dtype=wt.dtype).expand(n, k))
        if ctx is None:
            return made
        ctx.packed_weights[key] = made
    return ctx.packed_weights[key]


def _dnnl_weight(
    ctx: LoweringContext | None,
    ins: Instruction,
    w: torch.Tensor,
    rows: int,
    columns: tuple[int, int] | None = None,
) -> Any:
    """oneDNN's reordered form of the fixed (K, N) matrix `w` (of `ins`'s weight, or of its
    column part `columns`) for `rows` x K inputs (kept or not, as `_packed_weight`)."""
    key = ("dnnl_weight", id(ins.inputs[1]), rows) + (() if columns is None else columns)
    if ctx is None:
        return torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), rows)
    if key not in ctx.packed_weights:
        ctx.packed_weights[key] = torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), rows)
    return ctx.packed_weights[key]


#: `PGX_CPU_DNNL_GEMM`: how the `dnnl` kernel runs, `matmul` (the default: oneDNN's matmul
#: primitive through its C API, `onednn_linear.Linear`, where that library is loaded) or `torch`
#: (torch's oneDNN linear, `mkldnn._linear_pointwise`)
DNNL_GEMM_ENV = "PGX_CPU_DNNL_GEMM"


def dnnl_gemm_setting() -> str:
    """`PGX_CPU_DNNL_GEMM`: `matmul` (also when unset) or `torch`; another value is an error."""
    value = os.environ.get(DNNL_GEMM_ENV, "matmul").strip().lower() or "matmul"
    if value not in ("matmul", "torch"):
        raise ValueError(f"{DNNL_GEMM_ENV}={value!r}: expected matmul or torch")
    return value


def dnnl_kernel(
    ctx: LoweringContext | None,
    ins: Instruction,
    w: torch.Tensor,
    rows: int,
    bias: torch.Tensor | None,
    epilogue: str | None,
    columns: tuple[int, int] | None = None,
    residual: str | None = None,
    out_dtype: torch.dtype | None = None,
) -> Kernel:
    """The `dnnl` kernel of a (rows, K) input with the fixed (K, N) `w` (+ `bias`, then
    `epilogue`), or of its column part `columns` (`w` is then the whole weight): oneDNN's
    matmul primitive through its C API where the library is loaded (`onednn_linear.Linear`,
    made once and kept in `ctx`), else torch's oneDNN linear with the weight reordered once.

    Why the C API: on the 2-core EPYC (Zen 4, oneDNN 3.2 `brg:avx512_core[_bf16]` against
    torch's inner product), BERT-base's shapes 128 x {768 x 768, 768 x 3072, 3072 x 768}, warm,
    one thread: bf16 738 / 2842 / 2747 us against 794 / 2883 / 2790, float32 1474 / 5677 /
    5548 against 1564 / 5807 / 5662; two threads bf16 452 / 1488 / 1432 against 529 / 1555 /
    1537 (`benchmarks/xf11_gemm.py`); and no torch dispatcher between the steps."""
    if columns is not None:
        w = w[:, columns[0] : columns[1]]
    if dnnl_gemm_setting() == "matmul" and onednn_linear.available():
        if ctx is None:  # a candidate for measuring
            return onednn_linear.Linear(w, bias, rows, epilogue=epilogue)
        # the lowering asks for variants it does not keep (with and without the bias or the
        # activation): the first one packs the weight, the others share it (`twin`)
        base = ("onednn_linear", id(ins.inputs[1]), rows, columns)
        key = (*base, epilogue, None if bias is None else bias.data_ptr())
        if residual is not None or out_dtype is not None:
            key = (*key, residual, out_dtype)
        if key not in ctx.packed_weights:
            twin = next((v for k, v in ctx.packed_weights.items() if k[:4] == base), None)
            ctx.packed_weights[key] = onednn_linear.Linear(
                w, bias, rows, epilogue=epilogue, twin=twin, residual=residual,
                out_dtype=out_dtype,
            )  # fmt: skip
        return ctx.packed_weights[key]
    assert residual is None and out_dtype is None, (
        "a residual post-op or another result type needs oneDNN's C API (onednn_linear)"
    )
    weight = _dnnl_weight(ctx, ins, w, rows, columns)
    attr, algorithm = DNNL_EPILOGUES[epilogue] if epilogue else ("none", "")
    linear_pointwise = torch.ops.mkldnn._linear_pointwise
    return lambda x: linear_pointwise(x, weight, bias, attr, [], algorithm)


def dnnl_parts_kernel(
    ctx: LoweringContext, ins: Instruction, w: torch.Tensor, rows: int, bias: Any, parts: int
) -> Kernel | None:
    """The product of a (rows, K) input with the fixed (K, N) `w` (+ `bias`) in `parts` column
    parts of equal width as one batched oneDNN matmul (`onednn_linear.Linear(parts=...)`),
    returning a new (parts, rows, N / parts) tensor, each part dense; None without the C API
    library or with `PGX_CPU_DNNL_GEMM=torch` (the caller then runs one product per part).

    Why: Q / K / V as one primitive call, one parallel region instead of three (at two threads
    the three 768-column products scaled 1.81x where the 3072-column ones did 1.94x); the same
    work at one thread."""
    if dnnl_gemm_setting() != "matmul" or not onednn_linear.available():
        return None
    key = ("onednn_linear", id(ins.inputs[1]), rows, ("parts", parts), None,
           None if bias is None else bias.data_ptr())  # fmt: skip
    if key not in ctx.packed_weights:
        ctx.packed_weights[key] = onednn_linear.Linear(w, bias, rows, parts=parts)
    return ctx.packed_weights[key]


def use_dnnl(ctx: LoweringContext) -> bool:
    return (
        ctx.device.type == "cpu"
        and ctx.options.get("mkldnn", True)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


#: traced activation -> oneDNN's post-op (attr, algorithm) for `_linear_pointwise`
DNNL_EPILOGUES = {"gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"), "silu": ("swish", "")}


#: the product types `dot_producer` runs (bf16 only where `bf16_gemm` holds)
GEMM_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def cpu_has_bf16() -> bool:
    """oneDNN (through torch) computes bf16 natively on this processor (avx512_bf16, AMX, or
    the AVX-512 core set oneDNN's bf16 kernels need)."""
    return torch.backends.mkldnn.is_available() and bool(
        torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def bf16_gemm(ctx: LoweringContext) -> bool:
    """bf16 GEMMs and convolutions run natively: oneDNN on a CPU with bf16 instructions."""
    return use_dnnl(ctx) and cpu_has_bf16()


def _use_mkl(ctx: LoweringContext) -> bool:
    return (
        ctx.device.type == "cpu"
        and ctx.options.get("mkl_linear", True)
        and torch.backends.mkl.is_available()
    )


def _kernel(
    ctx: LoweringContext | None,
    ins: Instruction,
    name: str,
    w: torch.Tensor,
    rows: int,
    bias: torch.Tensor | None,
    epilogue: str | None,
) -> Kernel:
    """The product of a (rows, K) input with the fixed (K, N) `w` (+ `bias`, then `epilogue`,
    which only `dnnl` takes) through kernel `name` of `gemm_select.KERNELS`; the packed weight
    is kept in `ctx` (none: a throw-away candidate for measuring)."""
    if name == "dnnl":
        return dnnl_kernel(ctx, ins, w, rows, bias, epilogue)
    assert epilogue is None
    if name == "mkl":
        packed, original = _packed_weight(ctx, ins, w, rows)
        linear = torch.ops.mkl._mkl_linear
        return lambda x: linear(x, packed, original, bias, rows)
    if bias is not None:
        addmm = torch.addmm
        return lambda x: addmm(bias, x, w)
    mm = torch.mm
    return lambda x: mm(x, w)


def fast_kernel(
    ctx: LoweringContext,
    ins: Instruction,
    w: torch.Tensor,
    rows: int,
    bias: torch.Tensor | None,
    epilogue: str | None,
) -> Kernel | None:
    """The float32 / bf16 kernel `gemm_select` chooses for this product, or None when none
    takes the epilogue."""
    k, n = w.shape
    names = [name for name, ok in (("dnnl", use_dnnl(ctx)), ("mkl", _use_mkl(ctx))) if ok]
    names.append("addmm")
    if w.dtype == torch.bfloat16:  # only where `bf16_gemm` holds: oneDNN's bf16 kernels
        names = ["dnnl"]
    if epilogue is not None:
        names = names[:1] if names[0] == "dnnl" else []
    else:
        names = gemm_select.preferred(rows, k, n, names)
    if not names:
        return None
    keep_freed_memory()  # each run's new products reuse the last run's freed blocks
    name = gemm_select.choose(
        rows, k, n, names, lambda c: _kernel(None, ins, c, w, rows, bias, epilogue)
    )
    chosen = ctx.cache.setdefault(GEMM_KERNELS, {})
    classifier = epilogue is None and _cnn_classifier(ctx, ins, w)
    if classifier and name == "addmm" and rows == 1:
        chosen[id(ins)] = CLASSIFIER_KERNEL
        return _classifier_kernel(_linear(ctx, ins, w, rows, bias), w, bias)
    if classifier and name == "dnnl":
        chosen[id(ins)] = MATMUL_KERNEL
        return _linear(ctx, ins, w, rows, bias)
    if name == "dnnl" and gemm_select.setting() == "auto" and native_gemm.available(w, rows, epilogue):
        chosen[id(ins)] = WIDE_KERNEL
        return wide_linear(ctx, ins, w, rows, bias)
    chosen[id(ins)] = name
    return _kernel(ctx, ins, name, w, rows, bias, epilogue)


#: the kernel name recorded for a float32 product with a very wide weight (a language model's
#: head) on the native kernel (`native_gemm.WideLinear`; `PGX_CPU_GEMM_WIDE=0`: oneDNN's matmul)
WIDE_KERNEL = "native_wide"


def wide_linear(
    ctx: LoweringContext, ins: Instruction, w: torch.Tensor, rows: int, bias: torch.Tensor | None
) -> native_gemm.WideLinear:
    """`native_gemm.WideLinear` of `ins`'s fixed weight `w` (+ `bias`) for `rows` rows, packed
    once per compile (kept in `ctx.packed_weights`)."""
    key = ("native_wide", id(ins.inputs[1]), rows, None if bias is None else bias.data_ptr())
    if key not in ctx.packed_weights:
        ctx.packed_weights[key] = native_gemm.WideLinear(w, bias, rows)
    return ctx.packed_weights[key]


def wide_parts_kernel(
    ctx: LoweringContext, ins: Instruction, w: torch.Tensor, rows: int, bias: Any, parts: int
) -> native_gemm.WideLinear | None:
    """The product of a (rows, K) input with the fixed (K, N) float32 `w` (+ `bias`) in `parts`
    column parts of equal width (Q / K / V) on the native kernel, returning a new (parts, rows,
    N / parts) tensor as `dnnl_parts_kernel` does, where `native_gemm.available_parts` holds
    and `PGX_CPU_GEMM` is `auto` (helper gemm18b: GPT-2's / BERT's 128 x 768 x 2304 1.03x
    oneDNN's speed at one thread); records `WIDE_KERNEL` for `ins`. Else None. Chosen before
    oneDNN's batched weight is made: the weight is packed once."""
    if gemm_select.setting() != "auto" or not native_gemm.available_parts(w, rows, parts):
        return None
    if bias is not None and (bias.dtype != torch.float32 or bias.numel() != w.shape[1]):
        return None
    key = ("native_wide", id(ins.inputs[1]), rows, None if bias is None else bias.data_ptr(),
           ("parts", parts))  # fmt: skip
    if key not in ctx.packed_weights:
        ctx.packed_weights[key] = native_gemm.WideLinear(w, bias, rows, parts=parts)
    ctx.cache.setdefault(GEMM_KERNELS, {})[id(ins)] = WIDE_KERNEL
    return ctx.packed_weights[key]


#: the kernel names recorded for a CNN classifier's product: one row (`_classifier_kernel`),
#: more rows (oneDNN's matmul primitive through its C API, `onednn_linear.Linear`: faster than
#: torch's oneDNN linear, an inner product primitive, on these shapes: 1 thread, in the network,
#: the classifier step of MobileNetV2 at batch 8 524-542 -> 434-442 us, ResNet-50 704-758 ->
#: 577-602; `benchmarks/results/mnv2b1.md`)
CLASSIFIER_KERNEL = "addmm|onednn_matmul"
#: a one-row classifier's matmul on several threads: its columns in this many parts (a
#: batched product, oneDNN splitting the parts over the threads), and oneDNN's implementation
#: (a name prefix; None: oneDNN's first)
CLASSIFIER_PARTS = 1
CLASSIFIER_IMPL: str | None = None
MATMUL_KERNEL = "onednn_matmul"
#: the ops a classifier's input may pass through from the pooling or convolution that makes it
_FEATURE_VIEWS = frozenset({"flatten", "reshape", "squeeze", "unsqueeze", "contiguous"})


def _cnn_classifier(ctx: LoweringContext, ins: Instruction, w: torch.Tensor) -> bool:
    """Whether the float32 product `ins` is a CNN's classifier (it reads a pooling's or
    convolution's result, through views or the convolution's element-wise epilogue) that runs
    on oneDNN's matmul primitive (C API library loaded, no kernel forced by `PGX_CPU_GEMM`)."""
    if w.dtype != torch.float32 or gemm_select.setting() != "auto":
        return False
    if ctx.device.type != "cpu" or not onednn_linear.available():
        return False
    x = ins.inputs[0]
    while x.op.name in _FEATURE_VIEWS and x.inputs:
        x = x.inputs[0]
    if x.op.name == "pointwise" and x.inputs:  # a convolution's epilogue
        x = x.inputs[0]
    return x.op.name in ("pooling", "convolution")


def _linear(
    ctx: LoweringContext, ins: Instruction, w: torch.Tensor, rows: int, bias: torch.Tensor | None
) -> onednn_linear.Linear:
    """The C-API matmul of `ins`'s fixed weight `w` (+ `bias`) for `rows` rows, made once per
    compile (kept in `ctx.packed_weights`: a fused product's lowering asks for it several
    times); its primitive is made now only on several threads (on one, a one-row classifier
    runs `addmm`)."""
    key = ("onednn_linear", id(ins.inputs[1]), rows, None if bias is None else bias.data_ptr())
    parts = CLASSIFIER_PARTS if rows == 1 and w.shape[1] % max(CLASSIFIER_PARTS, 1) == 0 else 1
    if key not in ctx.packed_weights:
        now = rows > 1 or torch.get_num_threads() > 1
        ctx.packed_weights[key] = onednn_linear.Linear(
            w, bias, rows, now=now, parts=parts, impl=CLASSIFIER_IMPL
        )
    return ctx.packed_weights[key]


def _classifier_kernel(
    linear: onednn_linear.Linear, w: torch.Tensor, bias: torch.Tensor | None
) -> Kernel:
    """A CNN classifier's one-row product: `addmm` (MKL's matrix-vector kernel, one thread)
    when the step runs on one thread, oneDNN's matmul primitive through its C API
    (`linear`, all the step's threads) on more. The weight is cold at that point of a
    run (the network's weights went through the caches since); on the 2-core EPYC, MobileNetV2's
    1280 x 1000 classifier, caches flushed: one thread `addmm` 0.41 ms against oneDNN's 0.46-0.48,
    two threads 0.36-0.39 against 0.27-0.29 (`benchmarks/results/mnv2b1.md`)."""
    return ClassifierKernel(linear, w, bias)


#: a one-row classifier on several threads calls oneDNN on its source's and a new result's
#: addresses with no other torch op (`ClassifierKernel.producer`); False: reshape, call and view
#: as every product (the old path, for A/B)
LEAN_CLASSIFIER = True


class ClassifierKernel:
    """`_classifier_kernel`'s product: callable on a (1, K) source like every `Kernel`, and
    `producer` gives the step's whole product with no torch op but the result's allocation on
    several threads. Why: in a CNN's run the classifier is the first torch op after the oneDNN
    steps, and each op then pays torch's dispatcher coming back cold into the caches (the
    reshape, `contiguous` and view around the call: 40-75 us of MobileNetV2's classifier step
    at batch 1, 2 threads, besides oneDNN's call; `benchmarks/results/tail12.md`)."""

    def __init__(
        self, linear: onednn_linear.Linear, w: torch.Tensor, bias: torch.Tensor | None
    ) -> None:
        self.linear, self.w = linear, w
        self.b = torch.zeros(w.shape[1], dtype=w.dtype) if bias is None else bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.get_num_threads() == 1:
            return torch.addmm(self.b, x, self.w)
        return self.linear(x)

    def producer(
        self, env: list, a: int, out_lens: tuple[int, ...]
    ) -> Callable[[], torch.Tensor] | None:
        """The product of `env[a]` (a dense tensor of K values) as a new `out_lens` tensor; None
        when `LEAN_CLASSIFIER` is off or the result's layout is not the plain (1, N) one."""
        linear, w, b = self.linear, self.w, self.b
        k, n = w.shape
        if not LEAN_CLASSIFIER or linear.rows != 1 or math.prod(out_lens) != n:
            return None
        threads, addmm, empty, dtype = torch.get_num_threads, torch.addmm, torch.empty, w.dtype

        def produce() -> torch.Tensor:
            x = env[a]
            if threads() == 1:
                return addmm(b, x.reshape(1, k), w).view(out_lens)
            if not x.is_contiguous():
                x = x.contiguous()
            y = empty(out_lens, dtype=dtype)
            linear.primitive().execute(x, y)  # (addresses only: both dense, K and N values)
            return y

        return produce
