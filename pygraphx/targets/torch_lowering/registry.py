"""The table of torch lowerings by IR op name, and the bookkeeping of deferred producers.

The `lower_*` modules register their functions with `@lowering("op", ...)` when imported;
`lower.py` imports them and looks each instruction up in `LOWERINGS`. A lowering may defer a
producer into its only user (`defer`): the user's lowering then finds it with
`deferred_producer` and emits one step for both. Kept apart from `lower.py` so the lowering
modules and the walk that uses them do not import each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.context import Fuser, LoweringContext

#: op name -> lowering function (ctx, ins) -> bool (False: not handled, use the fallback)
LOWERINGS: dict[str, Callable[[LoweringContext, Instruction], bool]] = {}


def lowering(*names: str) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    """Register a lowering function for the IR ops `names`."""

    def deco(fn: Callable[..., bool]) -> Callable[..., bool]:
        for n in names:
            LOWERINGS[n] = fn
        return fn

    return deco


def defer(ctx: LoweringContext, producer: Instruction, user: Instruction, fuser: Fuser) -> bool:
    """Defer `producer` into `user` when nothing that writes memory runs between them."""
    pos = ctx.position
    module = ctx.module
    assert module is not None
    lo, hi = pos[id(producer)], pos[id(user)]
    for between in module.instructions[lo + 1 : hi]:
        if between.is_literal() or between.is_param():
            continue
        if between.op.output_alias(len(between.inputs)) >= 0:
            continue
        return False
    ctx.fusers[id(user)] = fuser
    ctx.producers[id(user)] = producer
    ctx.deferred.add(id(producer))
    return True


def storing(fn: Callable[[], None], env: list[Any], idx: int, value: Any) -> Callable[[], None]:
    """`fn`, then `env[idx] = value` (an unfused step whose fused twin stores a new tensor)."""

    def step() -> None:
        fn()
        env[idx] = value

    return step


def deferred_producer(ctx: LoweringContext, user: Instruction) -> Instruction:
    """The producer deferred into `user`."""
    return ctx.producers[id(user)]


def is_deferred(ctx: LoweringContext, ins: Instruction) -> bool:
    return id(ins) in ctx.deferred


__all__ = [
    "LOWERINGS",
    "Fuser",
    "defer",
    "deferred_producer",
    "is_deferred",
    "lowering",
    "storing",
]
