"""The numpy fallback of the torch lowering: an instruction no lowering handles runs through its
operator's numpy `compute()` on views of the tensors (sub-modules through the reference
evaluator), and the result is copied into its arena slot.
"""

from __future__ import annotations

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.runtime.evaluator import Evaluator
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.dtypes import from_numpy, to_numpy


def lower_fallback(ctx: LoweringContext, ins: Instruction) -> None:
    """Run `ins` through its numpy `compute()` on views of the tensors (on a CPU device; other
    devices copy to the host and back)."""
    ctx.fallbacks[ins.op.name] += 1
    env = ctx.env
    args = ctx.args(ins)
    op, shape = ins.op, ins.shape
    lens, dtype = tuple(shape.lens()), shape.dtype()
    where = _where(ctx, ins)
    modules = list(ins.module_inputs)
    outer = outer_refs(ctx, ins) if modules else []
    on_cpu = ctx.device.type == "cpu"
    host = to_numpy if on_cpu else _to_host

    def compute() -> np.ndarray:
        arrays = [host(env[i]) for i in args]
        try:
            if modules:
                values = {k: host(env[i]) for k, i in outer}
                res = op.compute_with_modules(shape, arrays, modules, values, Evaluator)
            else:
                res = op.compute(shape, arrays)
        except Exception as exc:  # re-raised naming the instruction, nothing lost
            raise RuntimeError(f"{where} {op}: {type(exc).__name__}: {exc}") from exc
        res = np.asarray(res)
        if res.shape != lens or res.dtype != dtype:
            raise RuntimeError(
                f"{where} {op}: computed {res.dtype}{list(res.shape)} but its shape is {shape}"
            )
        return res

    device = ctx.device
    if op.output_alias(len(ins.inputs)) >= 0 or not ctx.has_slot(ins) or not on_cpu:
        out = ctx.bind_dynamic(ins)

        def step() -> None:
            t = from_numpy(compute())
            env[out] = t if on_cpu else t.to(device)

    else:
        out, slot = ctx.output(ins)
        slot_np = to_numpy(slot)

        def step() -> None:
            np.copyto(slot_np, compute())

    ctx.emit(step, ins, out)


def _to_host(t: torch.Tensor) -> np.ndarray:
    return to_numpy(t.cpu())


def _where(ctx: LoweringContext, ins: Instruction) -> str:
    assert ctx.module is not None
    return f"{ctx.module.name}:@{ctx.position[id(ins)]}"


def outer_refs(ctx: LoweringContext, ins: Instruction) -> list[tuple[int, int]]:
    """(id of an outer instruction, its env index) for every outer value a sub-module uses."""
    refs: list[tuple[int, int]] = []
    seen: set[int] = set()
    stack = list(ins.module_inputs)
    while stack:
        mod = stack.pop()
        members = {id(i) for i in mod.instructions}
        for i in mod.instructions:
            stack.extend(i.module_inputs)
            for x in i.inputs:
                if id(x) not in members and id(x) in ctx.index and id(x) not in seen:
                    seen.add(id(x))
                    refs.append((id(x), ctx.index[id(x)]))
    return refs


__all__ = ["lower_fallback", "outer_refs"]
