"""Which GELU groups after a product run as the native pass (`native_gelu.py`) rather than
oneDNN's post-op: the choices `lower_gemm` makes for a product's activation group (helpers
gemm15, gelu16; issue 10)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering import gemm_select, native_gelu, native_gemm, onednn_linear
from pygraphx.targets.torch_lowering.context import LoweringContext, Step
from pygraphx.targets.torch_lowering.gemm_kernels import (
    GEMM_KERNELS,
    WIDE_KERNEL,
    batch_broadcast_matrix,
    dnnl_gemm_setting,
    dnnl_kernel,
    wide_linear,
)

__all__ = ["native_gelu_bf16", "native_gelu_f32", "wide_gelu_product"]


def native_gelu_f32(ctx: LoweringContext, dot: Instruction, user: Instruction, act: str) -> bool:
    """Whether the float32 product's gelu_tanh or gelu (erf) group runs as the product, then
    the native kernel's pass over it in place (`native_gelu.py`), not oneDNN's post-op."""
    if act not in native_gelu.PASSES:
        return False
    if dot.shape.type() != "float_type" or user.shape.type() != "float_type":
        return False
    if ctx.cache.get(GEMM_KERNELS, {}).get(id(dot)) != "dnnl":
        return False
    return native_gelu.available(act)


def wide_gelu_product(
    ctx: LoweringContext, dot: Instruction, bias: torch.Tensor | None, unfused: list[Step]
) -> Callable[[], torch.Tensor] | None:
    """The float32 product (with its `bias`) of a group whose GELU runs as the native pass
    (`native_gelu_f32` holds) on the native kernel (`native_gemm.available_gelu`: FFN-up's
    768 x 3072), as a new tensor of the product's shape; None where not taken (the oneDNN
    product stays). Records `WIDE_KERNEL` for `dot`.

    Where taken, the weight is held once: the profiling steps' product (`unfused[0]`, the dot
    alone) runs on the same packed weight without the bias, and oneDNN's packed copies of the
    weight, made by the lowering before this choice, leave `ctx.packed_weights` (they were
    +9.4 MB a layer of GPT-2 / BERT-base, gemm18.md section 4)."""
    w = batch_broadcast_matrix(ctx, dot, 1)
    if w is None or gemm_select.setting() != "auto":
        return None
    k, n = w.shape
    rows = dot.shape.elements() // n if n else 0
    if not native_gemm.available_gelu(w, rows):
        return None
    lin, env, a = wide_linear(ctx, dot, w, rows, bias), ctx.env, ctx.arg(dot, 0)
    ctx.cache.setdefault(GEMM_KERNELS, {})[id(dot)] = WIDE_KERNEL
    lens = tuple(dot.shape.lens())
    alone, idx = lin.without_bias(), unfused[0].out
    assert unfused[0].instructions[-1] is dot, "the profiling steps start with the dot alone"

    def product_alone() -> None:
        env[idx] = alone(env[a].reshape(rows, k)).view(lens)

    unfused[0].fn = product_alone
    weight = id(dot.inputs[1])
    for key in [key for key in ctx.packed_weights if key[:2] == ("onednn_linear", weight)]:
        del ctx.packed_weights[key]
    return lambda: lin(env[a].reshape(rows, k)).view(lens)


def native_gelu_bf16(
    ctx: LoweringContext,
    dot: Instruction,
    user: Instruction,
    act: str,
    bias: torch.Tensor | None,
) -> Callable[[], torch.Tensor] | None:
    """The bf16 product's gelu (erf) group as the product (with its bias) written in float32
    by oneDNN's matmul, then the native pass computing GELU and rounding once to a new bf16
    tensor (`native_gelu.GeluErfToBf16`), in place of oneDNN's post-op (also one rounding);
    None where not taken (`native_gelu.available(act, bf16=True)`)."""
    if act != "gelu" or dot.shape.type() != "bf16_type" or user.shape.type() != "bf16_type":
        return None
    if ctx.cache.get(GEMM_KERNELS, {}).get(id(dot)) != "dnnl":
        return None
    if dnnl_gemm_setting() != "matmul" or not onednn_linear.available():
        return None  # (a float32 result needs oneDNN's C API)
    if not native_gelu.available(act, bf16=True):
        return None
    w = batch_broadcast_matrix(ctx, dot, 1)
    if w is None:
        return None
    k, n = w.shape
    rows = dot.shape.elements() // n
    lin = dnnl_kernel(ctx, dot, w, rows, bias, None, out_dtype=torch.float32)
    gelu, env, a = native_gelu.GeluErfToBf16(), ctx.env, ctx.arg(dot, 0)
    lens = tuple(user.shape.lens())
    return lambda: gelu(lin(env[a].reshape(rows, k))).view(lens)
