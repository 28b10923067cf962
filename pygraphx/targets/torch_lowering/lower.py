"""Lowering a module to torch: the IR-op -> torch-call table and the walk that applies it.

`lower_module(module, device, options)` visits the instructions in order. Parameters get a
run-time slot, literals become tensors once, and every other instruction is handed to the
function registered for its op name (`@lowering("convolution")`, in the `lower_*` modules of
this package), which binds the instruction's value and emits the step that computes it. A
lowering may decline (return False) for inputs it does not handle (a dtype, an attribute); the
instruction then runs through its numpy `compute()` on numpy views of the tensors, and the
result is copied into its arena slot (`fallbacks` counts these by op name).

The option `unplanned` (instruction -> bool) picks instructions whose results the target's
lowerings always place themselves (the gpu target's convolutions, which cuDNN allocates, and
the epilogues run in place on them): the memory plan then leaves them out of the arena. The
option `fused_reads` (instruction -> the later instruction whose step computes it too, or None)
keeps a fused producer's inputs live through its user's step (`plan_memory`): the cpu target
passes `conv_fusion.fused_user` with `conv_output="arena"`, where the fused step writes the
user's arena slot while it reads the convolution's input. The option `shared_slot`
(instruction -> the input whose buffer its result may take over) lets a step write its result
over an input that dies there (the cpu target's convolution summing its residual in place).

A target may replace the lowering of some ops without touching this table: the option
`lowering_overrides` maps op names to lowering functions tried instead of the registered ones
(the `gpu` target lowers convolutions, GEMMs and fused groups its own way through it).

A lowering can also *defer* a producer into its only user (a convolution into the pointwise
group that adds its bias and applies relu): the user's lowering then emits one step for both,
keeping the separate steps for profiling. The producer must come right before its user (only
literals, parameters and views between them), so no buffer its inputs live in is reused in
between. A fused producer returns a new tensor and the user's epilogue runs on it in place, so
the fused step never writes the user's arena slot while it still reads the producer's inputs
(which the memory plan may have placed there, as they die at the producer), unless the plan
was made with `fused_reads` (then the slot and those inputs are apart).
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
from pygraphx.targets.torch_lowering.context import (
    STANDARD,
    LoweringContext,
    LoweringError,
    Step,
)
from pygraphx.targets.torch_lowering.dtypes import env_value, storable
from pygraphx.targets.torch_lowering.fallback import lower_fallback, needs_fallback, outer_refs
from pygraphx.targets.torch_lowering.literal_store import LITERALS
from pygraphx.targets.torch_lowering.mapped_reads import detach_run_time_weights
from pygraphx.targets.torch_lowering.pointwise import compiled_code
from pygraphx.targets.torch_lowering.registry import LOWERINGS


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
        lower_detection,
        lower_gemm,
        lower_layout,
        lower_math,
        lower_nn,
        lower_quant,
        lower_resize,
        lower_views,
    )


def lower_module(
    module: Module, device: torch.device, options: dict[str, Any] | None = None
) -> Lowered:
    """Lower `module` (already optimised; its memory plan is computed if missing)."""
    _load_lowerings()
    start = time.perf_counter()
    plan = _plan_for(module, options or {})
    ctx = LoweringContext(device=device, options=dict(options or {}), plan=plan)
    ctx.module = module
    ctx.position = {id(i): k for k, i in enumerate(module.instructions)}
    # targets/gpu still reads these three through `cache` (its code is edited elsewhere)
    ctx.cache.update(module=module, position=ctx.position, host_reads=ctx.host_reads)
    params: list[tuple[str, int]] = []
    outputs: list[int] = []
    for ins in module.instructions:
        name = ins.op.name
        if name == "@param":
            params.append((ins.op.parameter, ctx.bind_dynamic(ins)))
        elif name == "@literal":
            ctx.bind_static(ins, literal_tensor(ins, device, ctx.options), const=True)
        elif name == "@return":
            outputs = ctx.args(ins)
        else:
            lower_instruction(ctx, ins)
    if not module.instructions or not module.instructions[-1].is_return():
        outputs = [ctx.index[id(i)] for i in module.get_returns()]
    _add_releases(ctx, outputs)
    detach_run_time_weights(ctx, outputs)  # a model file rewritten in place cannot touch them
    profile = _profile_plan(ctx, module)
    return Lowered(ctx, params, outputs, profile, time.perf_counter() - start)


def _plan_for(module: Module, options: dict[str, Any]) -> MemoryPlan:
    """The pipeline's memory plan, or a new one where the options `unplanned` / `fused_reads`
    change it (or the module changed since it was planned)."""
    plan: MemoryPlan | None = module.memory_plan
    unplanned = options.get("unplanned")
    fused_reads = options.get("fused_reads")
    if fused_reads is not None and all(fused_reads(i) is None for i in module.instructions):
        fused_reads = None  # nothing fused to keep apart: the pipeline's plan holds
    shared = options.get("shared_slot")  # rn11: a result written over an input (`plan_memory`)
    if shared is not None and all(shared(i) is None for i in module.instructions):
        shared = None
    replan = unplanned is not None or fused_reads is not None or shared is not None
    if plan is None or replan or not _plan_matches(plan, module):
        plan = plan_memory(module, unplanned=unplanned, fused_reads=fused_reads, shared_slot=shared)
    return plan


def _plan_matches(plan: MemoryPlan, module: Module) -> bool:
    members = {id(i) for i in module.instructions}
    return all(id(b.ins) in members for b in plan.buffers)


def literal_tensor(
    ins: Instruction, device: torch.device, options: dict[str, Any] | None = None
) -> torch.Tensor | np.ndarray:
    """The literal as a tensor on `device` (a numpy array when torch cannot hold its type).
    Off the CPU (or with the option `share_literals`) through the shared store
    (`literal_store.py`): the specializations of one dynamic program, each lowered on its own,
    then hold one device copy of each weight."""
    array = ins.get_literal().array
    share = (options or {}).get("share_literals", device.type != "cpu")
    if share and storable(np.asarray(array).dtype):
        return LITERALS.tensor(array, device)
    t = env_value(array)
    return t if isinstance(t, np.ndarray) or t.device == device else t.to(device)


def lower_instruction(ctx: LoweringContext, ins: Instruction) -> None:
    """Bind `ins`'s value and emit its step(s) (through a fuser, its lowering, or numpy)."""
    fuser = ctx.fusers.get(id(ins))
    if fuser is not None and fuser(ctx, ins):
        return
    if needs_fallback(ctx, ins):
        lower_fallback(ctx, ins)
        return
    fn = ctx.options.get("lowering_overrides", {}).get(ins.op.name) or LOWERINGS.get(ins.op.name)
    if fn is not None:
        mark = (len(ctx.env), len(ctx.steps))
        if fn(ctx, ins):
            return
        if (len(ctx.env), len(ctx.steps)) != mark:
            raise LoweringError(f"lowering of {ins.op} declined after emitting steps")
    lower_fallback(ctx, ins)


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
        if ins.module_inputs:
            reads.update(idx for _, idx in outer_refs(ctx, ins))
    return reads


def _with_release(fn: Callable[[], None], env: list[Any], idxs: list[int]) -> Callable[[], None]:
    """`fn`, then `env[i] = None` for each of `idxs`: generated code, one source per count of
    indices (the indices are the closure's), so a network compiles a few sources only."""
    names = [f"i{k}" for k in range(len(idxs))]
    body = "".join(f"        env[{n}] = None\n" for n in names)
    args = "".join(f", {n}" for n in names)
    src = f"def _make(fn, env{args}):\n    def step():\n        fn()\n{body}    return step\n"
    glb: dict[str, Any] = {}
    exec(compiled_code(src, "<pygraphx release>"), glb)  # noqa: S102 - generated here
    step = glb["_make"](fn, env, *idxs)
    step.released = (fn, idxs)  # (`conv_chain` runs `fn` in a chain, then the releases)
    return step


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


__all__ = ["STANDARD", "Lowered", "lower_instruction", "lower_module"]
