"""int8 and fp8 products on the gpu target, captured in the CUDA graph with the rest.

* `quant_dot` of int8 x int8 with a constant right-hand side: `torch._int_mm` (exact int32
  sums). cuBLAS wants more than 16 rows and K, N multiples of 8: the weight is zero-padded once
  at prepare, the activation at run time into a private buffer (announced with a log line);
  zero padding leaves every sum unchanged. When its only user is the `dequantizelinear` with the
  folded per-column scale (`passes/fold_qdq.py`), that dequantise is the GEMM's epilogue
  (`quantise_kernels.dequantise`: one kernel, int32 in, the user's float type out); with Triton
  GEMMs, so is a bias / residual / ReLU group after it (`quant_epilogue.py`).
* `quant_dot` of fp8 e4m3 x fp8 e4m3 with a constant right-hand side (`passes/fold_fp8.py`
  makes them), by `torch._scaled_mm` (the default, `fp8_gemm.py`): with its scale, convert
  and bias group (`fold_fp8.split_fp8_scales`) as one GEMM with rowwise scales, bias and half
  out; else the float32 sums of exact fp8 products (unit scales), whose scale multiply is a
  `mul` in the element-wise group after it. `PGX_GPU_FP8_GEMM=triton`: the Triton GEMM
  (`quant_kernels.fp8_gemm`, autotuned per shape) with that group (scale, convert, bias, GELU,
  ReLU, residual, the next fp8 quantise) as its epilogue (`quant_epilogue.deferred_epilogue`);
  slower on the H200 so far (`fp8_gemm_choice`).
* `quant_dot` of two int8 activations (attention's products): a batched GEMM of the int8
  values as half with float32 accumulation and output (`runtime_sums`; float32 off CUDA),
  exact while 128 * 128 * K < 2**24 (K <= 1023), declined beyond; of two fp8 activations: the
  same (float32 sums of exact products, as the reference computes them).
* `quantizelinear` with one scale: `quantise_kernels.quantise_int8` / `quantise_fp8` (one pass
  each); to fp8 with a `dequantizelinear` of the same scale as its only user (an fp8
  round trip before a product kept in float, e.g. fp8 convolutions): both as one pass
  (`fake_quantise_fp8`), no fp8 tensor; fp8 with other scales: divide, clamp to +-448, cast.
* `quant_convolution` (`quant_conv.py`).

Everything else (and any case declined here) goes to the torch lowering, which on a GPU sends
integer products to the numpy fallback with a warning: the executable's `fallbacks` count them.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.gpu import quant_kernels as qk
from pygraphx.targets.gpu import quantise_kernels as qe
from pygraphx.targets.gpu.fp8_gemm import Fp8Gemm, lower_scaled_fp8, padded
from pygraphx.targets.gpu.quant_epilogue import EpiloguePlan, bind_quantised, deferred_epilogue
from pygraphx.targets.torch_lowering.context import STANDARD, LoweringContext
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.lower_math import output_buffer
from pygraphx.targets.torch_lowering.lower_quant import _emit_fresh, _fixed_matrix
from pygraphx.targets.torch_lowering.registry import defer

log = logging.getLogger(__name__)

Lowering = Callable[[LoweringContext, Instruction], bool]
Epilogue = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]

INT8_GEMM_ENV = "PGX_GPU_INT8_GEMM"
FP8_GEMM_ENV = "PGX_GPU_FP8_GEMM"
FP8 = "fp8e4m3fn_type"
FP8_MAX = 448.0
#: the largest K whose int8 sums a float32 GEMM adds exactly (128 * 128 * K < 2**24)
EXACT_FLOAT_K = 1023


def epilogue(triton: bool) -> Epilogue:
    return qe.dequantise if triton else qe.eager_dequantise


def int8_gemm_choice(triton: bool, env: str = INT8_GEMM_ENV) -> str:
    """`PGX_GPU_INT8_GEMM` (triton or cublas; triton by default where Triton kernels run) or,
    with `env`, `PGX_GPU_FP8_GEMM` (cublas by default: measured faster on the H200, see
    `fp8_gemm_choice`)."""
    default = "triton" if triton and env == INT8_GEMM_ENV else "cublas"
    choice = os.environ.get(env, "").strip() or default
    if choice not in ("triton", "cublas"):
        raise ValueError(f"{env}={choice!r}: expected triton or cublas")
    if choice == "triton" and not triton:
        return "cublas"  # Triton off for this target: the library path, as asked for there
    return choice


def fp8_gemm_choice(triton: bool) -> str:
    """`PGX_GPU_FP8_GEMM`: cublas (`torch._scaled_mm`, the default) or triton (the Triton fp8
    GEMM with the next group as its epilogue). On the H200 (BERT-base, batch 32) the Triton
    kernel, which promotes its sums to float32 every 32 products for float32-exact sums, took
    3.47 ms against 3.25 ms with `_scaled_mm` (and 3.02 ms with Hopper's default fp8
    accumulation, whose sums are not float32's: not offered); since `_scaled_mm` computes
    the scale and bias too (`fp8_gemm.py`), 3.24 ms against 2.37 ms."""
    choice = int8_gemm_choice(triton, FP8_GEMM_ENV)
    if choice == "triton" and torch.cuda.is_available():
        announce_inexact_fp8(FP8_GEMM_ENV)
    return choice


_ANNOUNCED: set[str] = set()


def announce_inexact_fp8(env: str) -> None:
    """Say once per setting that the opt-in Triton fp8 kernels' sums are not float32-exact on
    a GPU: on an H200 (Triton 3.6) Hopper's fp8 tensor cores kept fewer bits than float32
    despite the promotion every 32 products (relative error up to ~4e-4 of a sum against
    exact float32 sums; the GPU tests mark it). The default paths (`_scaled_mm`, cuDNN) are
    not affected."""
    if env in _ANNOUNCED:
        return
    _ANNOUNCED.add(env)
    warnings.warn(
        f"pygraphx gpu: {env}=triton is experimental: its fp8 sums are not float32-exact on "
        "this GPU's tensor cores (relative error up to ~4e-4 of a sum measured on an H200); "
        "unset it for the default fp8 path",
        RuntimeWarning,
        stacklevel=3,
    )


def dequantised_product(
    w: torch.Tensor, rows: int, device: torch.device, triton: bool
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]:
    """`(x, scale, out)`: `out = float32(x @ w) * scale` for int8 `x` (rows, K) and the
    constant int8 `w` (K, N): one Triton kernel (`quant_kernels.int8_gemm`, which also takes
    `epilogue` and `residual`), or `torch._int_mm` and the dequantise kernel
    (`PGX_GPU_INT8_GEMM`)."""
    if int8_gemm_choice(triton) == "triton":
        wt = w.t().contiguous()
        gemm = qk.int8_gemm

        def fused(x, scale, out, epilogue=None, residual=None, qout=None) -> None:
            x = x if x.stride(-1) == 1 else x.contiguous()
            gemm(x, wt, scale, out, epilogue, residual, qout)

        return fused
    library, finish = IntGemm(w, rows, device), epilogue(triton)

    def unfused(x, scale, out, epilogue=None, residual=None, qout=None) -> None:
        assert epilogue is None, "the library GEMM takes no epilogue"
        finish(library(x), scale, out)

    return unfused


def column_scale(ctx: LoweringContext, user: Instruction, n: int) -> torch.Tensor | None:
    """The scale of `user` (a 2-input dequantizelinear) as a float32 vector of `n` when it is a
    constant that varies along the last axis only."""
    if user.op.name != "dequantizelinear" or len(user.inputs) != 2:
        return None
    if id(user.inputs[1]) not in ctx.index:
        return None
    t = ctx.constant(ctx.arg(user, 1))
    if t is None or t.dim() == 0 or t.shape[-1] != n:
        return None
    if any(st != 0 for st, size in zip(t.stride()[:-1], t.shape[:-1], strict=True) if size > 1):
        return None
    return t[(0,) * (t.dim() - 1)].to(torch.float32).contiguous()


def dequantising_user(ctx: LoweringContext, ins: Instruction, n: int):
    """(the user, its column scale) when `ins`'s only user dequantises it per column."""
    if len(ins.outputs) != 1 or ins.outputs[0].inputs[0] is not ins:
        return None
    user = ins.outputs[0]
    scale = column_scale(ctx, user, n)
    return None if scale is None else (user, scale)


class IntGemm:
    """`rows x k` int8 times a constant `k x n` int8 weight through `torch._int_mm`, with the
    padding cuBLAS needs (more than 16 rows, K and N multiples of 8)."""

    def __init__(self, w: torch.Tensor, rows: int, device: torch.device) -> None:
        k, n = w.shape
        self.rows, self.k, self.n = rows, k, n
        self.rows_p = max(rows, 17) if device.type == "cuda" else rows
        k_p, n_p = padded(k), padded(n)
        # column-major (K, N): the "TN" operand order of cuBLASLt's int8 kernels
        self.w = torch.nn.functional.pad(w, (0, n_p - n, 0, k_p - k)).t().contiguous().t()
        self.buf = None
        if (self.rows_p, k_p) != (rows, k):
            self.buf = torch.zeros((self.rows_p, k_p), dtype=torch.int8, device=device)
        if self.buf is not None or n_p != n:
            log.info(
                "gpu int8 GEMM %dx%dx%d padded to %dx%dx%d for torch._int_mm (a copy per run)",
                rows, k, n, self.rows_p, k_p, n_p,
            )  # fmt: skip

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The int32 sums of the `rows x k` int8 `x` (a view of a padded result)."""
        if self.buf is not None:
            self.buf[: self.rows, : self.k].copy_(x)
            x = self.buf
        acc = torch._int_mm(x, self.w)
        return acc[: self.rows, : self.n]


def lower_gpu_quant_dot(
    ctx: LoweringContext, ins: Instruction, fallback: Lowering, triton: bool
) -> bool:
    """`quant_dot` on the GPU (see the module docstring), else `fallback`."""
    types = {x.shape.type() for x in ins.inputs}
    w = _fixed_matrix(ctx, ins)
    if types == {"int8_type"} and w is not None:
        return _lower_fixed(ctx, ins, IntGemm, w, triton)
    if types == {FP8} and w is not None:
        return _lower_fixed(ctx, ins, Fp8Gemm, w, triton)
    if types == {FP8} or (
        types == {"int8_type"} and ins.inputs[0].shape.lens()[-1] <= EXACT_FLOAT_K
    ):
        return _lower_runtime(ctx, ins, triton)
    return fallback(ctx, ins)


def _lower_fixed(ctx: LoweringContext, ins: Instruction, gemm_type, w, triton: bool) -> bool:
    k, n = w.shape
    rows = ins.shape.elements() // n if n else 0
    if rows == 0 or k == 0:
        return False
    if gemm_type is Fp8Gemm and fp8_gemm_choice(triton) == "triton":
        return _lower_fp8_triton(ctx, ins, w, rows)
    if gemm_type is Fp8Gemm and lower_scaled_fp8(ctx, ins, w, rows):
        return True
    fused = dequantising_user(ctx, ins, n) if gemm_type is IntGemm else None
    if fused is None:
        return _lower_fixed_unfused(ctx, ins, gemm_type(w, rows, ctx.device), rows, k, n)
    user, scale = fused
    product = dequantised_product(w, rows, ctx.device, triton)
    emit = _epilogue_emitter(ctx, ins, (rows, k, n), product, scale)

    def fuse(c: LoweringContext, u: Instruction) -> bool:
        if int8_gemm_choice(triton) == "triton" and deferred_epilogue(c, u, -1, n, emit):
            return True
        return emit(c, u, None)

    if defer(ctx, ins, user, fuse):
        return True
    return _lower_fixed_unfused(ctx, ins, gemm_type(w, rows, ctx.device), rows, k, n)


def _epilogue_emitter(ctx: LoweringContext, ins: Instruction, sizes, product, scale):
    """`emit(c, at, plan)`: the product of `ins` (`product(x, scale, out, epilogue, residual,
    qout)` on `rows x k` rows) writing the result of `at` (its dequantise, or the group of
    `plan`, with the group's quantise when the plan has one) into a new tensor; `plan.scale`
    (an fp8 product's, read from its group) replaces `scale` when the plan has one."""
    rows, k, n = sizes
    a, env = ctx.arg(ins, 0), ctx.env

    def emit(c: LoweringContext, at: Instruction, plan: EpiloguePlan | None) -> bool:
        ep = None if plan is None else plan.epilogue
        residual = (lambda: None) if plan is None else plan.residual_rows(env, _rows(rows, n))
        holder = {} if plan is None else bind_quantised(c, plan, STANDARD)
        s = scale if plan is None or plan.scale is None else plan.scale
        dtype, lens = torch_dtype(at.shape.dtype()), tuple(at.shape.lens())

        def produce() -> torch.Tensor:
            out = torch.empty(lens, dtype=dtype, device=env[a].device)
            q = None if plan is None else plan.quantised_output(lens, out.device)
            qv = None if q is None else q.view(rows, n)
            product(env[a].reshape(rows, k), s, out.view(rows, n), ep, residual(), qv)
            if q is not None:
                holder["q"] = q
            return out

        # a new tensor, not the user's arena slot: one kernel reads the input while it writes
        return _emit_fresh(c, at, produce)

    return emit


def _lower_fp8_triton(ctx: LoweringContext, ins: Instruction, w: torch.Tensor, rows: int) -> bool:
    """The float32 sums of an fp8 activation and the constant fp8 `w` (K, N) by the Triton
    GEMM (`quant_kernels.fp8_gemm`). When its only user is an element-wise group that starts
    with `fold_fp8`'s scale multiply (and convert) and goes on as an epilogue can
    (`quant_epilogue.deferred_epilogue(..., scaled=True)`: bias, residual, ReLU, GELU, an
    8-bit quantise), the group runs in the GEMM; else the sums alone (unit scales)."""
    k, n = w.shape
    wt, gemm = w.t().contiguous(), qk.fp8_gemm

    def product(x, scale, out, epilogue=None, residual=None, qout=None) -> None:
        x = x if x.stride(-1) == 1 else x.contiguous()
        gemm(x, wt, scale, out, epilogue, residual, qout)

    ones = torch.ones(n, dtype=torch.float32, device=ctx.device)
    emit = _epilogue_emitter(ctx, ins, (rows, k, n), product, ones)
    return deferred_epilogue(ctx, ins, -1, n, emit, scaled=True) or emit(ctx, ins, None)


def _rows(rows: int, n: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: t.reshape(rows, n)


def _lower_fixed_unfused(ctx, ins, gemm, rows: int, k: int, n: int) -> bool:
    a, env = ctx.arg(ins, 0), ctx.env
    idx, out = output_buffer(ctx, ins, STANDARD)
    out2 = out.view(rows, n)

    def step() -> None:
        out2.copy_(gemm(env[a].reshape(rows, k)))

    ctx.emit(step, ins, idx)
    return True


def _lower_runtime(ctx: LoweringContext, ins: Instruction, triton: bool) -> bool:
    """Two int8 (or fp8) activations: a float32 batched GEMM of their values (exact sums for
    int8), with the dequantise of its user as the epilogue when it has one."""
    a, b = ctx.args(ins)
    env = ctx.env
    m, k = ins.inputs[0].shape.lens()[-2:]
    n = ins.shape.lens()[-1]
    sums = runtime_sums(ctx.device, m, k, n, lambda: env[a], lambda: env[b])

    fused = dequantising_user(ctx, ins, n)
    if fused is not None:
        user, scale = fused
        finish = epilogue(triton)

        def fuse(c: LoweringContext, u: Instruction) -> bool:
            idx, out = output_buffer(c, u, STANDARD)
            out2 = out.view(-1, n)
            c.emit(lambda: finish(sums(), scale, out2), [ins, u], idx)
            return True

        if defer(ctx, ins, user, fuse):
            return True
    idx, out = output_buffer(ctx, ins, STANDARD)
    out2 = out.view(-1, n)
    ctx.emit(lambda: out2.copy_(sums()), ins, idx)
    return True


_HALF_BMM: dict[str, bool] = {}


def _half_bmm_to_float(device: torch.device) -> bool:
    """Whether this torch has `bmm(half, half, out_dtype=float32)` on `device` (checked once;
    without it the float32 `bmm` runs, and a log line says so)."""
    key = str(device)
    if key not in _HALF_BMM:
        x = torch.ones((1, 2, 2), dtype=torch.float16, device=device)
        try:
            _HALF_BMM[key] = torch.bmm(x, x, out_dtype=torch.float32).dtype == torch.float32
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            log.warning("gpu int8/fp8 activation products: float32 bmm (no half bmm: %s)", exc)
            _HALF_BMM[key] = False
    return _HALF_BMM[key]


def runtime_sums(device: torch.device, m: int, k: int, n: int, left, right):
    """`() -> (rows, n)` float32 sums of the batched product of two int8 / fp8 activations.
    On CUDA both go to half (exact for int8 and fp8 e4m3 values) and one half tensor-core
    `bmm` accumulates in float32 (`out_dtype`): the products of int8 / fp8 values are exact in
    float32, so int8 sums are exact for K <= 1023 as a float32 GEMM's are, at half the bytes
    and tensor-core speed. Elsewhere a float32 `bmm`."""
    f32, f16 = torch.float32, torch.float16
    if device.type == "cuda" and _half_bmm_to_float(device):

        def sums() -> torch.Tensor:
            x, y = left().reshape(-1, m, k).to(f16), right().reshape(-1, k, n).to(f16)
            return torch.bmm(x, y, out_dtype=f32).view(-1, n)

        return sums

    def sums_f32() -> torch.Tensor:
        x, y = left().reshape(-1, m, k).to(f32), right().reshape(-1, k, n).to(f32)
        return torch.bmm(x, y).view(-1, n)

    return sums_f32


def one_scale(ctx: LoweringContext, si: int) -> torch.Tensor | None:
    """The constant scale at slot `si` as a one-element float32 tensor when all its values are
    equal, else None."""
    scale = ctx.constant(si)
    if scale is None or scale.numel() == 0:
        return None
    flat = scale.reshape(-1)
    if not bool((flat == flat[0]).all()):
        return None
    return flat[:1].to(torch.float32).contiguous()


def lower_gpu_quantizelinear(
    ctx: LoweringContext, ins: Instruction, fallback: Lowering, triton: bool
) -> bool:
    """int8 or fp8 e4m3 with one constant scale as one pass (Triton, or torch ops without it);
    fp8 with a dequantise as its only user as one round-trip pass into the user's type (a
    product kept in float: fp8 convolutions); other fp8 with torch ops; else `fallback`."""
    x = ins.inputs[0]
    out_type = ins.shape.type()
    if len(ins.inputs) != 2 or x.shape.type() not in ("float_type", "half_type", "bf16_type"):
        return fallback(ctx, ins)
    xi, si = ctx.args(ins)
    one = one_scale(ctx, si)
    if out_type == FP8:
        if one is None:
            return _lower_fp8_quantise(ctx, ins, xi, si)
        if _lower_fake_fp8(ctx, ins, xi, one, triton):
            return True
        run = qe.quantise_fp8 if triton else qe.eager_quantise_fp8
        return _emit_quantise(ctx, ins, xi, one, run, torch.float8_e4m3fn)
    if out_type != "int8_type" or one is None:
        return fallback(ctx, ins)
    run = qe.quantise_int8 if triton else qe.eager_quantise_int8
    return _emit_quantise(ctx, ins, xi, one, run, torch.int8)


def _elementwise(env: list, xi: int, one: torch.Tensor, run, dtype: torch.dtype):
    """`() -> run(x, one, out)`'s fresh `out` of `dtype`, laid out as the dense `x`."""

    def produce() -> torch.Tensor:
        src = env[xi]
        if not _dense(src):
            src = src.contiguous()
        out = torch.empty_like(src, dtype=dtype)
        run(src, one, out)
        return out

    return produce


def _emit_quantise(ctx, ins, xi: int, one: torch.Tensor, run, dtype: torch.dtype) -> bool:
    """One step: `run(x, one, q)` into a fresh `dtype` tensor laid out as `x`."""
    produce = _elementwise(ctx.env, xi, one, run, dtype)
    return _emit_fresh(ctx, ins, produce, ctx.layout[xi])


def _lower_fake_fp8(ctx, ins, xi: int, one: torch.Tensor, triton: bool) -> bool:
    """fp8 quantise and its only user, a dequantise with the same one scale, as one pass."""
    if len(ins.outputs) != 1:
        return False
    user = ins.outputs[0]
    if user.op.name != "dequantizelinear" or len(user.inputs) != 2 or user.inputs[0] is not ins:
        return False
    if id(user.inputs[1]) not in ctx.index:
        return False
    theirs = one_scale(ctx, ctx.arg(user, 1))
    if theirs is None or not bool((theirs == one).all()):
        return False
    if user.shape.type() not in ("float_type", "half_type", "bf16_type"):
        return False
    run = qe.fake_quantise_fp8 if triton else qe.eager_fake_quantise_fp8
    produce = _elementwise(ctx.env, xi, one, run, torch_dtype(user.shape.dtype()))
    layout = ctx.layout[xi]
    return defer(ctx, ins, user, lambda c, u: _emit_fresh(c, u, produce, layout))


def lower_gpu_dequantizelinear(ctx: LoweringContext, ins: Instruction, fallback: Lowering) -> bool:
    """`float32(x) * float32(scale)` in the output's type for int8, int32 and fp8 e4m3 `x` and a
    float `scale` of any width (the torch lowering takes float32 scales only); else `fallback`."""
    x, s = ins.inputs[:2]
    floats = ("float_type", "half_type", "bf16_type")
    if len(ins.inputs) != 2 or x.shape.type() not in ("int8_type", "int32_type", FP8):
        return fallback(ctx, ins)
    if s.shape.type() not in floats or ins.shape.type() not in floats:
        return fallback(ctx, ins)
    env, (xi, si) = ctx.env, ctx.args(ins)
    out_dtype, f32 = torch_dtype(ins.shape.dtype()), torch.float32
    idx = ctx.bind_dynamic(ins, ctx.layout[xi])
    ctx.mark_fresh(idx)

    def step() -> None:
        env[idx] = torch.mul(env[xi].to(f32), env[si].to(f32)).to(out_dtype)

    ctx.emit(step, ins, idx)
    return True


def _dense(t: torch.Tensor) -> bool:
    """Whether `t` covers its memory without gaps in standard or channels-last order."""
    return t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)


def _lower_fp8_quantise(ctx: LoweringContext, ins: Instruction, xi: int, si: int) -> bool:
    env, layout = ctx.env, ctx.layout[xi]
    f8 = torch.float8_e4m3fn
    idx = ctx.bind_dynamic(ins, layout)
    ctx.mark_fresh(idx)

    def step() -> None:
        v = env[xi].to(torch.float32) / env[si].to(torch.float32)
        env[idx] = v.clamp_(-FP8_MAX, FP8_MAX).to(f8)

    ctx.emit(step, ins, idx)
    return True


__all__ = ["lower_gpu_dequantizelinear", "lower_gpu_quant_dot", "lower_gpu_quantizelinear"]
