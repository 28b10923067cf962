"""simplify_reshapes: collapse chains of layout operators (transpose, reshape, identity, ...).

Rules, one line each in the table below: transposes compose, reshapes of reshapes become one
reshape, and no-op layout changes disappear. (Identities and needless copies have passes of
their own: eliminate_identity, eliminate_contiguous.)
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops import make_op
from pygraphx.passes.pattern import Captures, Rule, RuleSet, op


def double_transpose(m: Module, ins: Instruction, c: Captures) -> Instruction | None:
    x = ins.inputs[0]
    p, q = x.op.permutation, ins.op.permutation
    perm = tuple(p[k] for k in q)
    if perm == tuple(range(len(perm))):
        return x.inputs[0]
    return m.insert_instruction(ins, make_op("transpose", permutation=perm), [x.inputs[0]])


def identity_transpose(m: Module, ins: Instruction, c: Captures) -> Instruction | None:
    perm = ins.op.permutation
    return ins.inputs[0] if tuple(perm) == tuple(range(len(perm))) else None


def same_lens(m: Module, ins: Instruction, c: Captures) -> Instruction | None:
    x = ins.inputs[0]
    return x if x.shape.lens() == ins.shape.lens() and x.shape.standard() else None


def double_reshape(m: Module, ins: Instruction, c: Captures) -> Instruction | None:
    x = ins.inputs[0].inputs[0]
    if not x.shape.standard():
        return None
    return m.insert_instruction(ins, make_op("reshape", dims=tuple(ins.shape.lens())), [x])


_RESHAPES = ("reshape", "squeeze", "unsqueeze", "flatten")

RULES = RuleSet("simplify_reshapes", [
    # transpose(x, identity) -> x
    Rule("identity_transpose", op("transpose"), identity_transpose),
    # transpose(transpose(x, p), q) -> transpose(x, p o q)
    Rule("double_transpose", op("transpose", op("transpose")), double_transpose),
    # reshape/squeeze/unsqueeze/flatten of a standard x to x's own lens -> x
    Rule("same_lens", op(_RESHAPES), same_lens),
    # reshape(reshape(x)) -> reshape(x) (any of the four on any of the four, x standard)
    Rule("double_reshape", op(_RESHAPES, op(_RESHAPES)), double_reshape),
])  # fmt: skip


def simplify_reshapes(module: Module) -> None:
    """Apply the layout rules to a fixed point."""
    RULES.apply(module)
