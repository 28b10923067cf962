"""eliminate_common_subexpression: merge instructions that compute the same value.

Two instructions are the same when their operators are equal (same class and attributes) and
their inputs are the same instructions; literals are the same when their shape and bytes are.
The later one is replaced by the earlier, so merges cascade in one forward walk.

Literals are not hashed whole (hashing every weight of a 400 MB model costs a second): they
are bucketed by shape and a sample of their bytes, and two literals of one bucket are merged
only when all their bytes are equal.
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module

#: how many evenly spaced elements of a literal go into its bucket key
SAMPLE = 64


def _literal_key(ins: Instruction) -> tuple:
    """The shape and a strided sample of the bytes: equal literals have equal keys."""
    flat = np.ascontiguousarray(ins.get_literal().array).reshape(-1)
    step = max(1, flat.size // SAMPLE)
    return ("@literal", ins.shape, flat[::step].tobytes())


def _key(ins: Instruction) -> tuple | None:
    if ins.is_param() or ins.is_return() or ins.op.name == "unknown":
        return None
    if ins.is_literal():
        return _literal_key(ins)
    return (ins.op, tuple(id(i) for i in ins.inputs), tuple(id(m) for m in ins.module_inputs))


def _same_literal(a: Instruction, b: Instruction) -> bool:
    x, y = a.get_literal().array, b.get_literal().array
    return x.dtype == y.dtype and x.tobytes() == y.tobytes()


def _first_equal(candidates: list[Instruction], ins: Instruction) -> Instruction | None:
    """The first of `candidates` (instructions with `ins`'s key) that computes its value."""
    if not ins.is_literal():
        return candidates[0]
    for first in candidates:
        if _same_literal(first, ins):
            return first
    candidates.append(ins)  # same sample, other bytes: a literal of its own
    return None


def eliminate_common_subexpression(module: Module) -> None:
    """Replace each repeated computation by its first occurrence."""
    seen: dict[tuple, list[Instruction]] = {}
    dead: list[Instruction] = []
    for ins in list(module.instructions):
        try:
            key = _key(ins)
            candidates = seen.get(key) if key is not None else None
        except TypeError:  # an attribute value that cannot be hashed: never merged
            continue
        if key is None:
            continue
        if candidates is None:
            seen[key] = [ins]
            continue
        first = _first_equal(candidates, ins)
        if first is None:
            continue
        module.replace_instruction(ins, first)
        dead.append(ins)
    if dead:
        module.remove_instructions(set(dead))
