"""Emitting the step of an op whose torch function allocates its result (convolution, pooling,
GEMM-like calls), shared by `lower_nn.py` and `conv_fusion.py`, and F.pad's argument order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.context import STANDARD, LoweringContext

Producer = Callable[[], torch.Tensor]


def store_result(
    ctx: LoweringContext,
    ins: Instruction,
    produce: Producer,
    layout: str = STANDARD,
    instructions: list[Instruction] | None = None,
    unfused: list[Any] | None = None,
) -> None:
    """Emit the step of an op whose torch function allocates its result: kept as a run-time
    value (conv_output="torch") or copied into the arena slot (conv_output="arena")."""
    env = ctx.env
    if ctx.options.get("conv_output", "torch") == "arena" and ctx.has_slot(ins):
        idx, out = ctx.output(ins, layout)

        def step() -> None:
            out.copy_(produce())

    else:
        idx = ctx.bind_dynamic(ins, layout)
        ctx.mark_fresh(idx)

        def step() -> None:
            env[idx] = produce()

    ctx.emit(step, instructions or ins, idx, unfused)


def torch_pad(begin: list[int], end: list[int]) -> list[int]:
    """F.pad's argument (last dimension first) from per-dimension begin/end lists."""
    pads: list[int] = []
    for b, e in zip(reversed(begin), reversed(end), strict=True):
        pads += [b, e]
    return pads


__all__ = ["Producer", "store_result", "torch_pad"]
