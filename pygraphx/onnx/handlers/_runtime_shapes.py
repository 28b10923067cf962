"""Run-time shape parameters for the ONNX handlers: `runtime_lens`, `guard`, `declared_lens`.

pygraphx shapes are static, but ONNX lets a shape-deciding input (Reshape's shape, Slice's
starts, Pad's pads, Expand's shape, Tile's repeats, ...) be a run-time tensor. When it is only
known at run time, a handler takes the output lens the model declares (`runtime_lens`), builds
static IR for them, and checks the run-time value against them: through `guard` (an IR
`shape_guard`, ops/layout.py) in front of a view, or through an op that computes from the value
itself (`dynamic_slice`, `dynamic_pad`). Without a declared shape the input must be a
compile-time constant, as usual (`ctx.require_const`).

Used by the handler modules (`layout.py`, `indexing.py`, `constants.py`, `signal.py`,
`extra.py`); the leading underscore keeps `handlers/__init__.py` from importing it as a handler
module (it registers none).
"""

from __future__ import annotations

from collections.abc import Sequence

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext
from pygraphx.ops.layout import ShapeGuard


def declared_lens(ctx: NodeContext, k: int = 0) -> list[int] | None:
    """The lens the model declares for output `k` (see `NodeContext.declared_lens`)."""
    return ctx.declared_lens(k)


def runtime_lens(ctx: NodeContext, ins: Instruction | None, what: str, k: int = 0) -> list[int]:
    """Static lens for output `k` when `ins`, a shape-deciding input, is only known at run time.

    They are the lens the model declares for the output; the caller checks the run-time value
    against them (`shape_guard`, or an op that computes from it). Without a declaration this
    raises the usual "must be known at compile time" error.
    """
    lens = declared_lens(ctx, k)
    if lens is None:
        ctx.require_const(ins, what)  # raises: a runtime value and no declared shape
        raise ctx.error(f"input {what!r} is a run-time value")  # pragma: no cover
    return lens


def guard(
    ctx: NodeContext, x: Instruction, value: Instruction, rule: str, expected: Sequence[int]
) -> Instruction:
    """`x`, after a run-time check that `value` gives `expected` under `rule` (see ShapeGuard)."""
    return ctx.add(ShapeGuard(rule, tuple(int(n) for n in expected)), x, value)
