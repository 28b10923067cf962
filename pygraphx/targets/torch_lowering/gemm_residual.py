"""A product that accumulates into its residual: `r += x @ w (+ bias)` in `r`'s memory.

`lower_gemm._fuse_dot` asks `residual_sum` whether a product's element-wise group is only
`dot (+ bias) + r` with `r` a tensor nothing else sees after it (a post-norm transformer's
out-projection and FFN-down products: BERT, MiniLM, ViT); `emit_residual_sum` then emits one
step running oneDNN's matmul with a sum post-op into `r` (`onednn_linear.Linear(residual="sum")`).
`PGX_CPU_GEMM_RESIDUAL=off` keeps the separate add. Split out of `lower_gemm.py` (issue 10).

A bf16 program's residual sum (`quantize_bf16` keeps it in float32: `float(dot (+ bias)) + r`,
`r` float32) runs the same way where `widened_residual_sum` finds it (helper gemm15): the bf16
product accumulates in float32 straight into `r` (oneDNN's matmul with a float32 destination and
the sum post-op), the bias added in float32, never rounded to bf16 in between (one rounding less
than the reference's `float(bf16(dot + bias))`: the largest error 1.6e-2 -> 2e-6 on a test
block, though a few elements in ten thousand come out up to 5e-7 further off). Before, the
product was rounded to a bf16 tensor, then a second step converted it and added `r` into another buffer.
Where `r` may not be overwritten (a pre-norm transformer's first residual, GPT-2's embedding sum,
is an arena slot) the step copies `r` into a new tensor and accumulates into that: the result
is then a tensor the step makes each run, so the next residual sum (GPT-2: the next 22) goes in
place. `PGX_CPU_GEMM_RESIDUAL_BF16=0` (or `PGX_CPU_GEMM_RESIDUAL=off`) keeps the old steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pygraphx.codegen.trace import Value
from pygraphx.ir.env import switch_on
from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering import onednn_linear
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.gemm_kernels import (
    GEMM_KERNELS,
    batch_broadcast_matrix,
    dnnl_gemm_setting,
    dnnl_kernel,
)
from pygraphx.targets.torch_lowering.pointwise import peel_add


#: `PGX_CPU_GEMM_RESIDUAL`: `sum` (the default) lets a product whose group adds a residual
#: it may overwrite accumulate into it (`residual_sum`); `off` keeps the separate add
RESIDUAL_ENV = "PGX_CPU_GEMM_RESIDUAL"
#: `0` / `off`: a bf16 product's float32 residual sum stays a product and a separate widening add
WIDENED_ENV = "PGX_CPU_GEMM_RESIDUAL_BF16"


def residual_setting() -> str:
    """`PGX_CPU_GEMM_RESIDUAL`: `sum` (also when unset) or `off`; another value is an error."""
    value = os.environ.get(RESIDUAL_ENV, "sum").strip().lower() or "sum"
    if value not in ("sum", "off"):
        raise ValueError(f"{RESIDUAL_ENV}={value!r}: expected sum or off")
    return value


def residual_sum(
    ctx: LoweringContext, dot: Instruction, user: Instruction, trace: Any, result: Any, k: int
) -> int | None:
    """The input of `user` that its (bias-peeled) group only adds to the product (`user =
    dot (+ bias) + r`), when the product may accumulate into `r` in place: oneDNN's matmul
    through its C API with a sum post-op (`onednn_linear.Linear(residual="sum")`), `r`'s
    memory then becoming the group's value. Else None.

    In place only where nothing else can see it: `r` of the product's type and shape, a new
    tensor its own step makes each run (`ctx.fresh`: a layer norm's result, say), not a
    program output, every other reader of it (none of them a view) in a step emitted before
    this one, and not the product's own input.

    Why: a post-norm transformer's out-projection and FFN-down products (BERT, MiniLM, ViT)
    end with the residual sum, which otherwise is a second pass over the product (and, at two
    threads, a second parallel region); a binary add post-op reading `r` was slower than that
    pass (oneDNN 3.2, the 2-core EPYC), a sum post-op is not (`benchmarks/results/gemm14.md`)."""
    if residual_setting() == "off" or dot.shape.type() != user.shape.type():
        return None
    if not _on_onednn_matmul(ctx, dot):
        return None
    lens = dot.shape.lens()
    cands = {
        j
        for j, x in enumerate(user.inputs)
        if x is not dot
        and x.shape.lens() == lens
        and x.shape.type() == dot.shape.type()
        and x.shape.standard()
    }
    peeled = peel_add(trace, result, k, cands)
    if peeled is None or peeled[1].kind != "in" or peeled[1].index != k:
        return None
    j = peeled[2]
    return j if _overwritable(ctx, user.inputs[j], dot, user) else None


def widened_residual_sum(
    ctx: LoweringContext, dot: Instruction, user: Instruction, trace: Any, result: Any, k: int
) -> tuple[int, bool] | None:
    """(j, in place) where the (bias-peeled) float32 group `user` of the bf16 product `dot` is
    exactly `float(dot) + r`, `r` = input `j` a float32 tensor of the product's shape; in place
    where the step may overwrite `r` (as `residual_sum` asks), else the step accumulates into a
    copy of `r`. None otherwise (see the module docstring)."""
    if residual_setting() == "off" or not switch_on(WIDENED_ENV):
        return None
    if (dot.shape.type(), user.shape.type()) != ("bf16_type", "float_type"):
        return None
    if not _on_onednn_matmul(ctx, dot):
        return None
    nodes = trace.nodes
    if len(nodes) != 2 or not (isinstance(result, Value) and result.kind == "node"):
        return None
    cast, add = nodes
    if result.index != 1 or add.fn != "add" or len(add.args) != 2 or cast.fn != "cast":
        return None
    src = cast.args[0] if cast.args else None
    if not (isinstance(src, Value) and src.kind == "in" and src.index == k):
        return None
    if cast.dtype != np.float32 or add.dtype != cast.dtype:
        return None
    others = [
        a for a in add.args if not (isinstance(a, Value) and a.kind == "node" and a.index == 0)
    ]
    if len(others) != 1 or not isinstance(others[0], Value) or others[0].kind != "in":
        return None
    j = others[0].index
    r = user.inputs[j]
    if j == k or r is dot or r.shape.type() != "float_type" or not r.shape.standard():
        return None
    if r.shape.lens() != dot.shape.lens():
        return None
    return j, _overwritable(ctx, r, dot, user)


def _on_onednn_matmul(ctx: LoweringContext, dot: Instruction) -> bool:
    """Whether `dot` runs on oneDNN's matmul primitive (the sum post-op's home)."""
    if ctx.cache.get(GEMM_KERNELS, {}).get(id(dot)) != "dnnl":
        return False
    return dnnl_gemm_setting() == "matmul" and onednn_linear.available()


def _overwritable(
    ctx: LoweringContext, r: Instruction, dot: Instruction, user: Instruction
) -> bool:
    """Whether the step of `user` may write over `r`'s tensor (see `residual_sum`; the
    convolutions' in-place sum asks the same, `conv_fusion._may_overwrite`)."""
    if not ctx.run_owned(r):
        return False
    if r is dot.inputs[0] or r.op.output_alias(len(r.inputs)) >= 0:
        return False
    others = [u for u in r.outputs if u is not user]
    if any(u.is_return() or u.op.output_alias(len(u.inputs)) >= 0 for u in others):
        return False
    # every other reader is in a step emitted already (one fused into a later step, e.g. a
    # product deferred into its group, is not, wherever it stands in the program)
    done = {id(i) for step in ctx.steps for i in step.instructions}
    return all(id(u) in done for u in others)


def emit_residual_sum(
    ctx: LoweringContext,
    dot: Instruction,
    user: Instruction,
    bias: torch.Tensor | None,
    j: int,
    produce: Callable[[], torch.Tensor],
    unfused: list,
    widened: bool = False,
    in_place: bool = True,
) -> None:
    """One step: `r += x @ w (+ bias)` in `r`'s memory (input `j` of `user`), stored as the
    group's value (a residual that is not dense at run time takes the product and an add).
    `widened`: a bf16 product into its float32 `r` (`widened_residual_sum`); not `in_place`:
    into a new copy of `r`."""
    w = batch_broadcast_matrix(ctx, dot, 1)
    k, n = w.shape
    rows = dot.shape.elements() // n
    out_dtype = torch.float32 if widened else None
    into = dnnl_kernel(ctx, dot, w, rows, bias, None, residual="sum", out_dtype=out_dtype).into
    env, a, ridx = ctx.env, ctx.arg(dot, 0), ctx.arg(user, j)
    uidx, lens = ctx.index[id(user)], tuple(user.shape.lens())

    if not in_place:
        empty, f32 = torch.empty, torch.float32

        def step() -> None:
            out = empty((rows, n), dtype=f32)
            out.copy_(env[ridx].reshape(rows, n))
            env[uidx] = into(env[a].reshape(rows, k), out).view(lens)

        ctx.emit(step, [dot, user], uidx, unfused)
        return

    def step() -> None:
        r = env[ridx]
        if r.is_contiguous():
            env[uidx] = into(env[a].reshape(rows, k), r.view(rows, n)).view(lens)
        else:
            env[uidx] = produce().float().add_(r) if widened else produce().add_(r)

    ctx.emit(step, [dot, user], uidx, unfused)
