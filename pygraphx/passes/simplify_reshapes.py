"""simplify_reshapes: collapse chains of layout operators (transpose, reshape, identity, ...).

Rules, one line each in the table below: transposes compose, reshapes of reshapes become one
reshape, and no-op layout changes disappear. (Identities and needless copies have passes of
their own: eliminate_identity, eliminate_contiguous.)
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops import make_op
from pygraphx.passes.rewrite import Rule, apply_to_fixed_point


def double_transpose(m: Module, ins: Instruction) -> Instruction | None:
    # transpose(transpose(x, p), q) -> transpose(x, p o q)
    x = ins.inputs[0]
    if x.op.name != "transpose":
        return None
    p, q = x.op.permutation, ins.op.permutation
    perm = tuple(p[k] for k in q)
    if perm == tuple(range(len(perm))):
        return x.inputs[0]
    return m.insert_instruction(ins, make_op("transpose", permutation=perm), [x.inputs[0]])


def identity_transpose(m: Module, ins: Instruction) -> Instruction | None:
    perm = ins.op.permutation
    return ins.inputs[0] if tuple(perm) == tuple(range(len(perm))) else None


def double_reshape(m: Module, ins: Instruction) -> Instruction | None:
    # reshape(reshape(x)) -> reshape(x); reshape to the same lens -> x
    x = ins.inputs[0]
    if x.shape.lens() == ins.shape.lens() and x.shape.standard():
        return x
    if x.op.name in ("reshape", "squeeze", "unsqueeze", "flatten") and x.inputs[0].shape.standard():
        return m.insert_instruction(
            ins, make_op("reshape", dims=tuple(ins.shape.lens())), [x.inputs[0]]
        )
    return None


# op name -> rules tried in order; each comment is the rule's algebra
RULES: dict[str, list[Rule]] = {
    "transpose": [
        identity_transpose,  # transpose(x, identity) -> x
        double_transpose,    # transpose(transpose(x, p), q) -> transpose(x, p o q)
    ],
    "reshape": [double_reshape],  # reshape(reshape(x)) -> reshape(x); same lens -> x
    "squeeze": [double_reshape],  # squeeze(reshape(x)) -> reshape(x)
    "unsqueeze": [double_reshape],  # unsqueeze(reshape(x)) -> reshape(x)
    "flatten": [double_reshape],  # flatten(reshape(x)) -> reshape(x)
}  # fmt: skip


def simplify_reshapes(module: Module) -> None:
    """Apply the layout rules to a fixed point."""
    apply_to_fixed_point(module, RULES)
