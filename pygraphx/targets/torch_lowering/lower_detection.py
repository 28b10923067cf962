"""Data-dependent detection operators lowered to torch: `unique`.

`unique` (ONNX Unique) runs `torch.unique` and stores a new tensor with the real number of
unique values every run (the IR shape is only an upper bound when the model leaves the count
open; a declared count is checked as the reference checks it). torch gives the values, the
inverse indices and the counts; the first-occurrence indices are the smallest position of each
unique value (a scatter-min over the inverse indices); unsorted output puts the unique values in
order of first occurrence. torch keeps every NaN apart where the reference (numpy) counts them as
one value, so a floating-point input holding NaN is computed by the operator's numpy code for
that run, with a warning the first time. Everything computed from the result runs through the
numpy fallback, which accepts the shorter lens (`fallback.needs_fallback`).

Declined (numpy fallback): types torch cannot compute in, and devices other than the CPU (a
length read back every run would rule out graph capture there).
"""

from __future__ import annotations

import warnings

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.dtypes import (
    COMPUTE_DTYPES,
    from_numpy,
    to_numpy,
    torch_dtype,
)
from pygraphx.targets.torch_lowering.registry import lowering


def _warn_nan(ins: Instruction, warned: list[bool]) -> None:
    if warned:
        return
    warned.append(True)
    warnings.warn(
        f"{ins.op}: the input holds NaN, which torch.unique keeps apart; this run computes it "
        "with numpy (NaNs count as one value, as the reference has it)",
        RuntimeWarning,
        stacklevel=2,
    )


def torch_unique(
    x: torch.Tensor, axis: int | None, sort: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """ONNX Unique in torch: (values, first indices, inverse indices, counts), int64 indices."""
    flat = x.reshape(-1) if axis is None else x
    dim = 0 if axis is None else axis
    values, inverse, counts = torch.unique(
        flat, sorted=True, return_inverse=True, return_counts=True, dim=dim
    )
    inverse = inverse.reshape(-1)
    length = inverse.numel()
    first = torch.full((counts.numel(),), length, dtype=torch.int64)
    positions = torch.arange(length, dtype=torch.int64)
    first.scatter_reduce_(0, inverse, positions, "amin")
    if not sort:
        order = torch.argsort(first)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), dtype=order.dtype)
        first, counts, inverse = first[order], counts[order], rank[inverse]
        values = flat.index_select(dim, first)
    return values, first, inverse.to(torch.int64), counts.to(torch.int64)


@lowering("unique")
def lower_unique(ctx: LoweringContext, ins: Instruction) -> bool:
    op = ins.op
    src = ins.inputs[0].shape
    if torch_dtype(src.dtype()) not in COMPUTE_DTYPES or ctx.device.type != "cpu":
        return False
    axis = None if op.axis is None else op.axis % max(src.ndim(), 1)
    sort, pick, count = bool(op.sorted), op.output, op.count
    x = ctx.arg(ins, 0)
    env = ctx.env
    out = ctx.bind_dynamic(ins)
    ctx.mark_fresh(out)

    floating = src.dtype().kind == "f"
    warned: list[bool] = []

    def step() -> None:
        t = env[x]
        if floating and bool(torch.isnan(t).any()):
            _warn_nan(ins, warned)
            env[out] = from_numpy(op.compute(ins.shape, [to_numpy(t)]))
            return
        results = torch_unique(t, axis, sort)
        n = results[3].numel()
        if count >= 0 and n != count:
            raise ValueError(
                f"unique: the data gives {n} unique values, but the model declares {count} "
                "(the program was compiled for the declared shape)"
            )
        env[out] = results[pick].contiguous()

    ctx.emit(step, ins, out)
    return True
