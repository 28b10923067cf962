"""eliminate_common_subexpression: merge instructions that compute the same value.

Two instructions are the same when their operators are equal (same class and attributes) and
their inputs are the same instructions; literals are the same when their shape and bytes are.
The later one is replaced by the earlier, so merges cascade in one forward walk.
"""

from __future__ import annotations

import hashlib

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module


def _key(ins: Instruction) -> tuple | None:
    if ins.is_param() or ins.is_return() or ins.op.name == "unknown":
        return None
    if ins.is_literal():
        arr = ins.get_literal().array
        digest = hashlib.blake2b(arr.tobytes(), digest_size=16).digest()
        return ("@literal", ins.shape, digest)
    return (ins.op, tuple(id(i) for i in ins.inputs), tuple(id(m) for m in ins.module_inputs))


def eliminate_common_subexpression(module: Module) -> None:
    """Replace each repeated computation by its first occurrence."""
    seen: dict[tuple, Instruction] = {}
    dead: list[Instruction] = []
    for ins in list(module.instructions):
        try:
            key = _key(ins)
        except TypeError:  # an attribute value that cannot be hashed: never merged
            continue
        if key is None:
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = ins
            continue
        if first.is_literal() and ins.is_literal():
            a, b = first.get_literal().array, ins.get_literal().array
            if a.dtype != b.dtype or a.tobytes() != b.tobytes():
                continue
        module.replace_instruction(ins, first)
        dead.append(ins)
    for ins in dead:
        module.remove_instruction(ins)
