"""fp8 e4m3 GEMMs with a constant weight through `torch._scaled_mm` on the gpu target.

* `Fp8Gemm`: the float32 sums (unit scales, float32 out); the scale multiply after it runs in
  the element-wise group that follows (the path when nothing below applies).
* `lower_scaled_fp8`: when the product's only user is the `pointwise` group of its scale
  `mul`, `convert` to half / bf16 and optionally the bias `add` (`passes/fold_fp8.py`
  `split_fp8_scales` makes it after the fusion passes), that group is the GEMM:
  `_scaled_mm` with rowwise scales (1 for every row, the folded per-column scale for the
  columns), the bias, and the group's type out (`ScaledFp8Gemm`). The half output is rounded
  once from the float32 `sums * scale + bias`, where the program rounds after the `convert`
  and again after the `add` (at most one half step apart); the group after it then reads half
  values, as in the fp16 program, instead of the float32 sums (issue 12: on an H200 the
  rowwise `_scaled_mm` with half out and bias takes the time of the unit-scale float32 one,
  `benchmarks/results/h200_fp8_scaled_mm_probe.json`).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.passes.fold_fp8 import column_constant
from pygraphx.targets.gpu.quant_epilogue import _body, _leading_scale
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.lower_quant import _emit_fresh
from pygraphx.targets.torch_lowering.registry import defer

log = logging.getLogger(__name__)

__all__ = ["Fp8Gemm", "ScaledFp8Gemm", "lower_scaled_fp8", "padded"]
HALF_DTYPES = (torch.float16, torch.bfloat16)


def padded(size: int, multiple: int = 8) -> int:
    return -(-size // multiple) * multiple


class Fp8Gemm:
    """`rows x k` fp8 e4m3 times a constant fp8 weight through `torch._scaled_mm` (unit scales,
    float32 sums); K and N are padded to multiples of 16 as cuBLASLt's fp8 GEMM wants."""

    def __init__(self, w: torch.Tensor, rows: int, device: torch.device) -> None:
        k, n = w.shape
        self.rows, self.k, self.n = rows, k, n
        self.k_p, self.n_p = padded(k, 16), padded(n, 16)
        wide = torch.zeros((self.n_p, self.k_p), dtype=torch.float32, device=device)
        wide[:n, :k] = w.t().to(torch.float32)
        self.wt = wide.to(w.dtype).t()  # column-major (K, N), as _scaled_mm wants
        self.buf = None
        if self.k_p != k:
            self.buf = torch.zeros((rows, self.k_p), dtype=w.dtype, device=device)
        self.one = torch.ones((), dtype=torch.float32, device=device)

    def operand(self, x: torch.Tensor) -> torch.Tensor:
        """`x` as `_scaled_mm` takes it: row-major, K padded."""
        if self.buf is not None:
            self.buf[:, : self.k].copy_(x)
            return self.buf
        return x if x.is_contiguous() else x.contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        one = self.one
        acc = torch._scaled_mm(
            self.operand(x), self.wt, scale_a=one, scale_b=one, out_dtype=torch.float32
        )
        return acc[:, : self.n]


class ScaledFp8Gemm(Fp8Gemm):
    """`half(float32 sums * scale[n] + bias[n])` of `rows x k` fp8 `x` and the constant fp8
    weight in one `_scaled_mm` (rowwise scales: 1 per row, `scale` per column)."""

    def __init__(self, w, rows: int, device, scale, bias, dtype: torch.dtype) -> None:
        super().__init__(w, rows, device)
        n, n_p = self.n, self.n_p
        self.dtype = dtype
        self.row_scale = torch.ones((rows, 1), dtype=torch.float32, device=device)
        self.col_scale = torch.zeros((1, n_p), dtype=torch.float32, device=device)
        self.col_scale[0, :n] = scale.to(device)
        self.bias = None
        if bias is not None:
            self.bias = torch.zeros(n_p, dtype=dtype, device=device)
            self.bias[:n] = bias.to(device=device, dtype=dtype)
        if n_p != n:
            log.info("gpu fp8 GEMM N=%d padded to %d for torch._scaled_mm (a copy per run)", n, n_p)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch._scaled_mm(
            self.operand(x), self.wt, scale_a=self.row_scale, scale_b=self.col_scale,
            bias=self.bias, out_dtype=self.dtype,
        )  # fmt: skip
        return out if self.n_p == self.n else out[:, : self.n].contiguous()


def scaled_group(ctx: LoweringContext, ins: Instruction, n: int):
    """(the group, its per-column float32 scale, its bias or None) when `ins`'s only user is a
    `pointwise` group computing `mul(ins, column scale)` in float32, `convert` to half or bf16
    and optionally `add(that, column constant)`, and nothing else; else None."""
    if len(ins.outputs) != 1:
        return None
    group = ins.outputs[0]
    if group.op.name != "pointwise" or len(group.module_inputs) != 1:
        return None
    if sum(x is ins for x in group.inputs) != 1 or group.shape.lens() != ins.shape.lens():
        return None
    if torch_dtype(group.shape.dtype()) not in HALF_DTYPES:
        return None
    source, running, steps = _body(group, ins)
    lead = _leading_scale(ctx, group, steps, source, running, (-1, n))
    if lead is None:  # (a half group: the multiply and its convert)
        return None
    scale, last, rest = lead
    bias = None
    if len(rest) == 2 and rest[0].op.name == "add" and last in rest[0].inputs:
        add = rest[0]
        other = add.inputs[1] if add.inputs[0] is last else add.inputs[0]
        if id(other) not in source or other is last:
            return None
        # the bias comes after the product in the program: its literal, not yet its tensor
        values = column_constant(group.inputs[source[id(other)]], n)
        bias = None if values is None else torch.from_numpy(values.astype(np.float32))
        last, rest = (add, rest[1:]) if bias is not None else (last, rest)
    if len(rest) != 1 or not rest[0].is_return() or list(rest[0].inputs) != [last]:
        return None
    return group, scale, bias


def lower_scaled_fp8(ctx: LoweringContext, ins: Instruction, w: torch.Tensor, rows: int) -> bool:
    """The fp8 `quant_dot` `ins` (constant weight `w`, (K, N)) and its scale / bias group as
    one `_scaled_mm` into the group's type (module docstring); False when the group is not
    that (nothing is deferred: the caller lowers `ins` alone)."""
    k, n = w.shape
    found = scaled_group(ctx, ins, n)
    if found is None:
        return False
    group, scale, bias = found
    dtype = torch_dtype(group.shape.dtype())
    a, env, lens = ctx.arg(ins, 0), ctx.env, tuple(group.shape.lens())

    def fuse(c: LoweringContext, g: Instruction) -> bool:
        gemm = ScaledFp8Gemm(w, rows, c.device, scale, bias, dtype)  # (the weight, once)
        return _emit_fresh(c, g, lambda: gemm(env[a].reshape(rows, k)).view(lens))

    return defer(ctx, ins, group, fuse)
