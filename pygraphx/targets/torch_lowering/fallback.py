"""The numpy fallback of the torch lowering: an instruction no lowering handles runs through its
operator's numpy `compute()` on views of the tensors (sub-modules through the reference
evaluator), and the result is copied into its arena slot.

Two kinds of instruction always come here (`needs_fallback`), counted and announced like the
rest: those with a value torch cannot hold (sub-byte types, e8m0, strings: see `dtypes.py`),
among their inputs, output or the insides of a fused group, whose values then stay numpy arrays
in `env`; and those computed from a data-dependent value
whose length the model leaves open (NonZero, Unique, NonMaxSuppression with `count=-1`; the
IR shape is only an upper bound, as in the ref evaluator), whose results are stored with their
real lens instead of in an arena slot. The data-dependent instruction itself keeps its lowering
when it has one (it must store the real length), and comes here otherwise.
"""

from __future__ import annotations

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.runtime.evaluator import Evaluator
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.dtypes import env_value, host_array, storable, to_numpy


def needs_fallback(ctx: LoweringContext, ins: Instruction) -> bool:
    """True when `ins` must run through numpy whatever lowering its op has (see the module);
    records it in `ctx.bounded` when its lens are only bounded by its shape."""
    op = ins.op
    open_length = op.data_dependent and getattr(op, "count", -1) < 0
    from_bounded = any(id(i) in ctx.bounded for i in ins.inputs)
    if open_length or from_bounded:
        ctx.bounded.add(id(ins))
    if from_bounded:
        return True
    return not all(storable(i.shape.dtype()) for i in _values(ins))


def _values(ins: Instruction) -> list[Instruction]:
    """`ins`, its inputs, and every instruction of its sub-modules (a fused group's insides)."""
    values = [ins, *ins.inputs]
    stack = list(ins.module_inputs)
    while stack:
        mod = stack.pop()
        values.extend(mod.instructions)
        for i in mod.instructions:
            stack.extend(i.module_inputs)
    return values


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
    host = host_array if on_cpu else _to_host
    bounded = id(ins) in ctx.bounded

    def compute() -> np.ndarray:
        arrays = [host(env[i]) for i in args]
        try:
            if modules:
                values = {k: host(env[i]) for k, i in outer}
                evaluator = _bounded_evaluator if bounded else Evaluator
                res = op.compute_with_modules(shape, arrays, modules, values, evaluator)
            else:
                res = op.compute(shape, arrays)
        except Exception as exc:  # re-raised naming the instruction, nothing lost
            raise RuntimeError(f"{where} {op}: {type(exc).__name__}: {exc}") from exc
        res = np.asarray(res)
        if not _fits(res, lens, bounded) or res.dtype != dtype:
            bound = "outside its bound" if bounded else "but its shape is"
            raise RuntimeError(
                f"{where} {op}: computed {res.dtype}{list(res.shape)} {bound} {shape}"
            )
        return res

    device = ctx.device
    dynamic = bounded or not storable(dtype) or not ctx.has_slot(ins)
    if op.output_alias(len(ins.inputs)) >= 0 or dynamic or not on_cpu:
        out = ctx.bind_dynamic(ins)

        def step() -> None:
            t = env_value(compute())
            env[out] = t if on_cpu or isinstance(t, np.ndarray) else t.to(device)

    else:
        out, slot = ctx.output(ins)
        slot_np = to_numpy(slot)

        def step() -> None:
            np.copyto(slot_np, compute())

    ctx.emit(step, ins, out).fallback = True


def _bounded_evaluator(module: Module) -> Evaluator:
    """An evaluator of a sub-module run on bounded values: every value's lens may be smaller
    than its shape's (as the ref evaluator has it downstream of a data-dependent op)."""
    evaluator = Evaluator(module)
    evaluator.bounded.update(id(i) for i in evaluator.instructions)
    return evaluator


def _fits(res: np.ndarray, lens: tuple[int, ...], bounded: bool) -> bool:
    """`res` has the lens of the shape, or for a bounded value lens within them."""
    if not bounded:
        return res.shape == lens
    return res.ndim == len(lens) and all(n <= m for n, m in zip(res.shape, lens, strict=True))


def _to_host(t: torch.Tensor | np.ndarray) -> np.ndarray:
    return t if isinstance(t, np.ndarray) else to_numpy(t.cpu())


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


__all__ = ["lower_fallback", "needs_fallback", "outer_refs"]
