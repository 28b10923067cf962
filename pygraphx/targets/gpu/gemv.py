"""Products of a few rows with a constant matrix (a classifier at batch 1) as one Triton kernel.

cuBLAS allocates a workspace (32 MiB on Hopper) for every stream it runs on, the CUDA graph's
capture stream included, on the first call there; for a CNN at batch 1 whose only GEMM is its
classifier that workspace is most of the program's activation memory. A product of at most
`MAX_ROWS` rows is memory bound (it reads the weight once), so a plain kernel that streams the
weight is as fast as the library's and needs no workspace: each program computes `BLOCK_N`
outputs of one row, reading the weight transposed ([N, K], K contiguous: coalesced rows) once;
float32 accumulation. The transposed weight takes the place of the uploaded one when this
product is its only user, so the weight is held once.

Half and bf16 products only (float32 keeps cuBLAS, exact to its own rounding); off with
`PGX_GPU_GEMV=0` (then cuBLAS runs them, with its workspace).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.context import STANDARD, LoweringContext
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.lower_math import output_buffer

GEMV_ENV = "PGX_GPU_GEMV"
#: products with more rows than this go to cuBLAS (they reuse each weight tile across rows)
MAX_ROWS = 4
BLOCK_N, BLOCK_K = 8, 256


@triton.jit
def _gemv_kernel(
    a_ptr, wt_ptr, out_ptr, K, N, stride_am, stride_wn, stride_om,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + row * stride_am + offs_k, mask=offs_k < K, other=0.0)
        w_mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
        w_ptrs = wt_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]
        w = tl.load(w_ptrs, mask=w_mask, other=0.0)
        acc += tl.sum(w.to(tl.float32) * a.to(tl.float32)[None, :], axis=1)
    out = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_om + offs_n, out, mask=offs_n < N)


def gemv_wanted() -> bool:
    return os.environ.get(GEMV_ENV, "1").strip() != "0"


def gemv(a: torch.Tensor, wt: torch.Tensor, out: torch.Tensor) -> None:
    """out[m, n] = sum_k a[m, k] * wt[n, k] for 2-D `a` and `out` with unit inner stride and a
    contiguous `wt`."""
    rows, k = a.shape
    n = wt.shape[0]
    grid = (rows, math.ceil(n / BLOCK_N))
    _gemv_kernel[grid](
        a, wt, out, k, n, a.stride(0), wt.stride(0), out.stride(0),
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=4,
    )  # fmt: skip


def lower_gemv(ctx: LoweringContext, ins: Instruction) -> bool:
    """`dot` of at most `MAX_ROWS` half / bf16 rows with a constant 2-D weight, as `gemv`."""
    a_shape, w_shape = (i.shape for i in ins.inputs)
    dtype = torch_dtype(ins.shape.dtype())
    if dtype not in (torch.float16, torch.bfloat16) or w_shape.ndim() != 2 or not gemv_wanted():
        return False
    if any(torch_dtype(i.shape.dtype()) != dtype for i in ins.inputs):
        return False
    lens = a_shape.lens()
    k, n = w_shape.lens()
    rows = math.prod(lens[:-1])
    w = ctx.constant(ctx.arg(ins, 1))
    if w is None or rows > MAX_ROWS or lens[-1] != k:
        return False
    wt = w.t().contiguous()
    ctx.replace_literal(ins, 1, wt)
    a = ctx.arg(ins, 0)
    idx, out = output_buffer(ctx, ins, STANDARD)
    out2 = out.view(rows, n)
    env = ctx.env

    def step() -> None:
        x = env[a].reshape(rows, k)
        gemv(x if x.stride(-1) == 1 else x.contiguous(), wt, out2)

    ctx.emit(step, ins, idx)
    return True
