"""propagate_constant: evaluate at compile time what depends only on literals (constant folding).

Every instruction computable from literals alone is found; those whose value is still needed by
runtime instructions (the frontier) are evaluated with the reference semantics and replaced by
one literal each. A broadcast on the frontier is not materialised (that would store a large
repeated tensor): its input is folded instead and the broadcast view stays.

Bound: an instruction whose value would be larger than `PGX_CONST_FOLD_LIMIT` bytes (default
64 MiB) *and* larger than its inputs together is not folded (nor is anything computed from it),
so a tiny file cannot make the compiler allocate gigabytes (a ConstantOfShape [1e5, 1e5] stays a
run-time instruction); folding a large weight's transpose or conversion (no growth) is still
done. The frontend's parse-time evaluation of constant inputs (`OnnxParser.const_value`) obeys
the same bound. Evaluation walks the graph iteratively, so a chain of any depth folds without
recursion.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.env import whole_number
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.passes.dead_code_elimination import dead_code_elimination

_NEVER_FOLD = {"@param", "@return", "@literal", "unknown"}
LIMIT_ENV = "PGX_CONST_FOLD_LIMIT"
DEFAULT_LIMIT = 64 << 20


def fold_limit() -> int:
    """Bytes above which a growing constant is not folded (`PGX_CONST_FOLD_LIMIT`)."""
    value = os.environ.get(LIMIT_ENV, "").strip()
    if not value:
        return DEFAULT_LIMIT
    return whole_number(LIMIT_ENV, value, 0, "bytes")


def too_large_to_fold(ins: Instruction, limit: int) -> bool:
    """Whether folding `ins` would materialise more than `limit` bytes that its inputs do not
    already hold (see the module docstring)."""
    size = ins.shape.elements() * ins.shape.type_size()
    if size <= limit:
        return False
    # what the inputs really hold: a broadcast view's buffer is its small source
    return size > sum(i.shape.bytes() for i in ins.inputs)


def evaluate_constant(ins: Instruction, values: dict[int, np.ndarray]) -> np.ndarray:
    """The value of constant instruction `ins`, its constant inputs evaluated first with an
    explicit stack (no recursion); `values` memoises results by instruction id."""
    stack = [ins]
    while stack:
        top = stack[-1]
        if id(top) in values:
            stack.pop()
            continue
        if top.is_literal():
            values[id(top)] = top.get_literal().array
            stack.pop()
            continue
        missing = [i for i in top.inputs if id(i) not in values]
        if missing:
            stack.extend(missing)
            continue
        stack.pop()
        args = [values[id(i)] for i in top.inputs]
        values[id(top)] = np.asarray(top.op.compute(top.shape, args))
    return values[id(ins)]


def _is_broadcast_view(ins: Instruction) -> bool:
    return ins.op.output_alias(len(ins.inputs)) >= 0 and ins.shape.broadcasted()


def propagate_constant(module: Module) -> None:
    """Fold constant sub-graphs into literals."""
    const: set[int] = set()
    limit = fold_limit()
    skipped = 0
    for ins in module.instructions:
        if ins.is_literal():
            const.add(id(ins))
        elif (
            ins.op.name not in _NEVER_FOLD
            and not ins.module_inputs
            and ins.inputs
            and all(id(i) in const for i in ins.inputs)
        ):
            if too_large_to_fold(ins, limit) and not _is_broadcast_view(ins):
                skipped += 1
            else:
                const.add(id(ins))
    if skipped:
        warnings.warn(
            f"propagate_constant: {skipped} constant instruction(s) in module {module.name!r} "
            f"left to run time: their values exceed {LIMIT_ENV}={limit} bytes",
            stacklevel=2,
        )
    frontier: list[Instruction] = []
    for ins in module.instructions:
        if id(ins) not in const or ins.is_literal():
            continue
        if any(id(u) not in const for u in ins.outputs):
            if _is_broadcast_view(ins):
                frontier.extend(i for i in ins.inputs if not i.is_literal())
            else:
                frontier.append(ins)
    if not frontier:
        return
    values: dict[int, np.ndarray] = {}
    done: set[int] = set()
    for ins in frontier:
        if id(ins) in done:
            continue
        done.add(id(ins))
        arr = _standard_view(c_ordered(evaluate_constant(ins, values)))
        # a read-only result is a view of an (immutable) literal: a reshape, an unsqueeze or a
        # broadcast to new size-1 axes of a weight keeps its memory (a memory-mapped weight
        # stays mapped); a writeable one was computed here and is not needed elsewhere. Either
        # is kept without a copy when it has the standard strides the literal's shape needs.
        keep = arr.strides == _standard_strides(arr)
        lit = module.insert_literal(ins, Literal(arr, copy=not keep))
        module.replace_instruction(ins, lit)
    dead_code_elimination(module)


#: column bands of a transposed matrix that `c_ordered` copies at once, and the size (in
#: elements) from which it bothers
BAND, BANDED_FROM = 256, 1 << 16


def c_ordered(arr: np.ndarray) -> np.ndarray:
    """`arr` in C order: itself when it already is, else a copy. A transposed matrix (a folded
    transpose of a weight, possibly with size-1 axes) is copied in bands of `BAND` columns: each
    band reads a block of source rows that stays in cache, where numpy's element-order copy
    strides through the whole source for every output row (2-3x slower on a 150 MB weight)."""
    if arr.flags.c_contiguous:
        return arr
    mat = np.squeeze(arr)
    if mat.ndim != 2 or mat.size < BANDED_FROM or not 0 < mat.strides[0] < mat.strides[1]:
        return np.asarray(arr, order="C")
    out = np.empty(mat.shape, mat.dtype)
    for j in range(0, mat.shape[1], BAND):
        out[:, j : j + BAND] = mat[:, j : j + BAND]
    return out.reshape(arr.shape)


def _standard_view(arr: np.ndarray) -> np.ndarray:
    """A read-only view whose only odd strides are on size-1 axes (a broadcast to [1, K, N] of
    a [K, N] weight has stride 0 there) as the same memory with the standard strides, so the
    folded literal stays a view of the weight (mapped, shared by every specialization)."""
    ones = tuple(i for i, n in enumerate(arr.shape) if n == 1)
    if arr.flags.writeable or not ones or arr.strides == _standard_strides(arr):
        return arr
    return np.expand_dims(np.squeeze(arr, axis=ones), ones)


def _standard_strides(arr: np.ndarray) -> tuple[int, ...]:
    """The byte strides of a C-ordered array of `arr`'s shape and type."""
    strides, step = [], arr.itemsize
    for n in reversed(arr.shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
