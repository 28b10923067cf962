"""Lowering a module to torch: the IR-op -> torch-call table and the walk that applies it.

`lower_module(module, device, options)` visits the instructions in order. Parameters get a
run-time slot, literals become tensors once, and every other instruction is handed to the
function registered for its op name (`@lowering("convolution")`, in the `lower_*` modules of
this package), which binds the instruction's value and emits the step that computes it. A
lowering may decline (return False) for inputs it does not handle (a dtype, an attribute); the
instruction then runs through its numpy `compute()` on numpy views of the tensors, and the
result is copied into its arena slot (`fallbacks` counts these by op name).

A lowering can also *defer* a producer into its only user (a convolution into the pointwise
group that adds its bias and applies relu): the user's lowering then emits one step for both,
keeping the separate steps for profiling. The producer must come right before its user (only
literals, parameters and views between them), so no buffer its inputs live in is reused in
between. A fused producer returns a new tensor and the user's epilogue runs on it in place, so
the fused step never writes the user's arena slot while it still reads the producer's inputs
(which the memory plan may have placed there, as they die at the producer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.passes.memory_coloring import MemoryPlan, plan_memory
from pygraphx.runtime.evaluator import Evaluator
from pygraphx.targets.torch_lowering.context import (
    STANDARD,
    LoweringContext,
    LoweringError,
    Step,
)
from pygraphx.targets.torch_lowering.dtypes import from_numpy, to_numpy

#: op name -> lowering function (ctx, ins) -> bool (False: not handled, use the fallback)
LOWERINGS: dict[str, Callable[[LoweringContext, Instruction], bool]] = {}

#: deferred producer -> function lowering it together with its user
Fuser = Callable[[LoweringContext, Instruction], bool]


def lowering(*names: str) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    """Register a lowering function for the IR ops `names`."""

    def deco(fn: Callable[..., bool]) -> Callable[..., bool]:
        for n in names:
            LOWERINGS[n] = fn
        return fn

    return deco


@dataclass
class Lowered:
    """A lowered module: the env, its steps, where parameters go and outputs come from."""

    ctx: LoweringContext
    params: list[tuple[str, int]]
    outputs: list[int]
    profile: list[tuple[Instruction, Callable[[], None] | None, int]]
    seconds: float

    @property
    def steps(self) -> list[Step]:
        return self.ctx.steps


def _load_lowerings() -> None:
    # the lowering modules register themselves on import
    from pygraphx.targets.torch_lowering import (  # noqa: F401
        lower_gemm,
        lower_layout,
        lower_math,
        lower_nn,
        lower_views,
    )


def lower_module(
    module: Module, device: torch.device, options: dict[str, Any] | None = None
) -> Lowered:
    """Lower `module` (already optimised; its memory plan is computed if missing)."""
    _load_lowerings()
    start = time.perf_counter()
    plan: MemoryPlan | None = module.memory_plan
    if plan is None or not _plan_matches(plan, module):
        plan = plan_memory(module)
    ctx = LoweringContext(device=device, options=dict(options or {}), plan=plan)
    ctx.cache["module"] = module
    ctx.cache["position"] = {id(i): k for k, i in enumerate(module.instructions)}
    params: list[tuple[str, int]] = []
    outputs: list[int] = []
    for ins in module.instructions:
        name = ins.op.name
        if name == "@param":
            params.append((ins.op.parameter, ctx.bind_dynamic(ins)))
        elif name == "@literal":
            ctx.bind_static(ins, literal_tensor(ins, device), const=True)
        elif name == "@return":
            outputs = ctx.args(ins)
        else:
            lower_instruction(ctx, ins)
    if not module.instructions or not module.instructions[-1].is_return():
        outputs = [ctx.index[id(i)] for i in module.get_returns()]
    _add_releases(ctx, outputs)
    profile = _profile_plan(ctx, module)
    return Lowered(ctx, params, outputs, profile, time.perf_counter() - start)


def _plan_matches(plan: MemoryPlan, module: Module) -> bool:
    members = {id(i) for i in module.instructions}
    return all(id(b.ins) in members for b in plan.buffers)


def literal_tensor(ins: Instruction, device: torch.device) -> torch.Tensor:
    t = from_numpy(ins.get_literal().array)
    return t if t.device == device else t.to(device)


def lower_instruction(ctx: LoweringContext, ins: Instruction) -> None:
    """Bind `ins`'s value and emit its step(s) (through a fuser, its lowering, or numpy)."""
    fuser = ctx.cache.get(("fuse", id(ins)))
    if fuser is not None and fuser(ctx, ins):
        return
    fn = LOWERINGS.get(ins.op.name)
    if fn is not None:
        mark = (len(ctx.env), len(ctx.steps))
        if fn(ctx, ins):
            return
        if (len(ctx.env), len(ctx.steps)) != mark:
            raise LoweringError(f"lowering of {ins.op} declined after emitting steps")
    lower_fallback(ctx, ins)


def defer(ctx: LoweringContext, producer: Instruction, user: Instruction, fuser: Fuser) -> bool:
    """Defer `producer` into `user` when nothing that writes memory runs between them."""
    pos = ctx.cache["position"]
    module = ctx.cache["module"]
    lo, hi = pos[id(producer)], pos[id(user)]
    for between in module.instructions[lo + 1 : hi]:
        if between.is_literal() or between.is_param():
            continue
        if between.op.output_alias(len(between.inputs)) >= 0:
            continue
        return False
    ctx.cache[("fuse", id(user))] = fuser
    ctx.cache[("producer", id(user))] = producer
    ctx.cache[("deferred", id(producer))] = True
    return True


def storing(fn: Callable[[], None], env: list[Any], idx: int, value: Any) -> Callable[[], None]:
    """`fn`, then `env[idx] = value` (an unfused step whose fused twin stores a new tensor)."""

    def step() -> None:
        fn()
        env[idx] = value

    return step


def deferred_producer(ctx: LoweringContext, user: Instruction) -> Instruction:
    """The producer deferred into `user`."""
    return ctx.cache[("producer", id(user))]


def is_deferred(ctx: LoweringContext, ins: Instruction) -> bool:
    return bool(ctx.cache.get(("deferred", id(ins))))


# --- the numpy fallback -------------------------------------------------------------------


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
    outer = _outer_refs(ctx, ins) if modules else []
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
    module = ctx.cache["module"]
    return f"{module.name}:@{ctx.cache['position'][id(ins)]}"


def _outer_refs(ctx: LoweringContext, ins: Instruction) -> list[tuple[int, int]]:
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


# --- releases and profiling -----------------------------------------------------------------


def _add_releases(ctx: LoweringContext, outputs: list[int]) -> None:
    """Drop run-time tensors after their last use, so torch can reuse their memory."""
    readers: dict[int, int] = {}
    for k, step in enumerate(ctx.steps):
        for idx in step_reads(ctx, step):
            readers[idx] = k
    keep = set(outputs) | {i for i, s in enumerate(ctx.static) if s}
    drops: dict[int, list[int]] = {}
    for idx, k in readers.items():
        if idx not in keep:
            drops.setdefault(k, []).append(idx)
    for k in sorted(drops, reverse=True):
        idxs = sorted(set(drops[k]))
        step = ctx.steps[k]
        step.fn = _with_release(step.fn, ctx.env, idxs)


def step_reads(ctx: LoweringContext, step: Step) -> set[int]:
    reads: set[int] = set()
    for ins in step.instructions:
        for i in ins.inputs:
            idx = ctx.index.get(id(i))
            if idx is not None:
                reads.add(idx)
        for sub in ins.module_inputs:
            for _, idx in _outer_refs_of(ctx, sub):
                reads.add(idx)
    return reads


def _outer_refs_of(ctx: LoweringContext, module: Module) -> list[tuple[int, int]]:
    members = {id(i) for i in module.instructions}
    out = []
    for i in module.instructions:
        for x in i.inputs:
            if id(x) not in members and id(x) in ctx.index:
                out.append((id(x), ctx.index[id(x)]))
    return out


def _with_release(fn: Callable[[], None], env: list[Any], idxs: list[int]) -> Callable[[], None]:
    body = "".join(f"        env[{i}] = None\n" for i in idxs)
    src = f"def _make(fn, env):\n    def step():\n        fn()\n{body}    return step\n"
    glb: dict[str, Any] = {}
    exec(compile(src, "<pygraphx release>", "exec"), glb)  # noqa: S102 - generated here
    return glb["_make"](fn, env)


def _profile_plan(
    ctx: LoweringContext, module: Module
) -> list[tuple[Instruction, Callable[[], None] | None, int]]:
    """Every instruction in module order with the step that computes it (None: no work at
    run time, e.g. a literal or a view fixed at prepare) and the env index of its value."""
    by_last: dict[int, Step] = {}
    for step in ctx.steps:
        for sub in step.unfused or [step]:
            by_last[id(sub.instructions[-1])] = sub
    plan = []
    for ins in module.instructions:
        if ins.is_return():
            continue
        step = by_last.get(id(ins))
        idx = ctx.index.get(id(ins), -1)
        plan.append((ins, step.fn if step is not None else None, idx))
    return plan


__all__ = [
    "LOWERINGS",
    "STANDARD",
    "Lowered",
    "defer",
    "is_deferred",
    "lower_fallback",
    "lower_instruction",
    "lower_module",
    "lowering",
]
