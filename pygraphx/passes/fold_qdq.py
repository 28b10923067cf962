"""fold_qdq: turn `dot` / `convolution` of dequantised int8 values into integer products.

The pattern (what `quantize_int8` inserts, and the symmetric part of ONNX QDQ models):

    dot(dequantizelinear(qa, sa), dequantizelinear(qb, sb))
    convolution(dequantizelinear(qx, sx), dequantizelinear(qw, sw))

with 8-bit `qa`/`qx` and `qb`/`qw`, no zero point (or an all-zero constant one), constant scales,
the left one per tensor (one value everywhere) and the right one per output channel (varying
only along the last axis of a `dot`'s right operand, or axis 0 of a convolution's weights),
becomes

    dequantizelinear(quant_dot(qa, qb), s)        s[n] = float(sa) * float(sb[n])
    dequantizelinear(quant_convolution(qx, qw), s)    (broadcast along the output channels)

so the product is exact int32 accumulation and the two scales are folded into one dequantise of
the result. The folded scale is the product of the two scales rounded once to the scale type.
A `dot` or `convolution` whose inputs do not fit the pattern (a non-zero zero point, a per-row
activation scale, a runtime scale) is left as it is.
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops.base import make_op
from pygraphx.passes.dead_code_elimination import dead_code_elimination
from pygraphx.passes.propagate_constant import evaluate_constant

__all__ = ["fold_qdq"]

_EIGHT_BIT = frozenset({"int8_type", "uint8_type"})


def _is_constant(ins: Instruction) -> bool:
    stack, seen = [ins], set()
    while stack:
        top = stack.pop()
        if id(top) in seen:
            continue
        seen.add(id(top))
        if top.is_param() or top.module_inputs or top.op.name in ("@return", "unknown"):
            return False
        stack.extend(top.inputs)
    return True


def _dequantised(ins: Instruction) -> tuple[Instruction, np.ndarray | Instruction] | None:
    """(the 8-bit value, its scale) when `ins` is a symmetric dequantizelinear: the scale is a
    constant array, or, for a scale computed at run time, the value its multibroadcast
    spreads (the per-row / per-column scales of dynamic quantisation)."""
    if ins.op.name != "dequantizelinear" or ins.inputs[0].shape.type() not in _EIGHT_BIT:
        return None
    if len(ins.inputs) == 3 and (
        not _is_constant(ins.inputs[2]) or np.any(evaluate_constant(ins.inputs[2], {}) != 0)
    ):
        return None
    scale = ins.inputs[1]
    if _is_constant(scale):
        return ins.inputs[0], np.asarray(evaluate_constant(scale, {}))
    if scale.op.name == "multibroadcast":
        return ins.inputs[0], scale.inputs[0]
    return None


def _channel_scales(scale: np.ndarray, axis: int) -> np.ndarray | None:
    """The per-channel scale vector along `axis` when `scale` varies along no other axis."""
    moved = np.moveaxis(scale, axis, 0)
    vector = moved.reshape(moved.shape[0], -1)[:, 0]
    column = vector.reshape((-1,) + (1,) * (moved.ndim - 1))
    if not np.array_equal(moved, np.broadcast_to(column, moved.shape)):
        return None
    return vector


def _fold(module: Module, ins: Instruction) -> bool:
    left, right = (_dequantised(x) for x in ins.inputs)
    if left is None or right is None:
        return False
    (qa, sa), (qb, sb) = left, right
    if isinstance(sa, Instruction) or isinstance(sb, Instruction):
        return ins.op.name == "dot" and _fold_runtime(module, ins, qa, sa, qb, sb)
    if sa.size == 0 or np.any(sa != sa.flat[0]):
        return False
    is_dot = ins.op.name == "dot"
    channels = _channel_scales(sb, sb.ndim - 1 if is_dot else 0)
    if channels is None:
        return False
    stype = ins.inputs[1].shape.dtype()
    folded = (np.float64(sa.flat[0]) * channels.astype(np.float64)).astype(stype)
    lens = tuple(ins.shape.lens())
    vector = module.insert_literal(ins, Literal(folded))
    if is_dot:
        spread = make_op("multibroadcast", out_lens=lens)
    else:
        spread = make_op("broadcast", axis=1, out_lens=lens)
    scale = module.insert_instruction(ins, spread, [vector])  # before the product: lowerings
    if is_dot:  # that fuse the product with its dequantise find the scale already bound
        product = module.insert_instruction(ins, make_op("quant_dot"), [qa, qb])
    else:
        product = module.insert_instruction(
            ins, make_op("quant_convolution", **ins.op.attributes()), [qa, qb]
        )
    result = module.insert_instruction(ins, make_op("dequantizelinear"), [product, scale])
    module.replace_instruction(ins, result)
    module.remove_instruction(ins)
    return True


def _side_vector(
    scale: np.ndarray | Instruction, axis: int, ndim: int
) -> np.ndarray | Instruction | None:
    """What spreads a `dot` operand's scale over the product (None: it does not fold): a
    run-time scale must have the product's rank and length 1 along `axis` (the other
    operand's axis: -1 for the left operand's per-row scales, -2 for the right's per-column
    ones); a constant one must be one value (left) or one per output column (right)."""
    if isinstance(scale, Instruction):
        small = scale.shape.lens()
        return scale if len(small) == ndim and small[axis] == 1 else None
    if axis == -1:
        if scale.size == 0 or np.any(scale != scale.flat[0]):
            return None
        return scale.reshape(-1)[:1]
    return _channel_scales(scale, scale.ndim - 1)


def _fold_runtime(
    module: Module,
    ins: Instruction,
    qa: Instruction,
    sa: np.ndarray | Instruction,
    qb: Instruction,
    sb: np.ndarray | Instruction,
) -> bool:
    """Fold a `dot` whose scales are (partly) computed at run time: per row of the left
    operand, per column of the right one; the folded scale is their product, computed at
    run time."""
    lens = tuple(ins.shape.lens())
    sides = [_side_vector(sa, -1, len(lens)), _side_vector(sb, -2, len(lens))]
    if any(side is None for side in sides):
        return False
    views = []
    for side in sides:
        if not isinstance(side, Instruction):
            side = module.insert_literal(ins, Literal(side.astype(ins.inputs[1].shape.dtype())))
        views.append(
            module.insert_instruction(ins, make_op("multibroadcast", out_lens=lens), [side])
        )
    scale = module.insert_instruction(ins, make_op("mul"), views)
    product = module.insert_instruction(ins, make_op("quant_dot"), [qa, qb])
    result = module.insert_instruction(ins, make_op("dequantizelinear"), [product, scale])
    module.replace_instruction(ins, result)
    module.remove_instruction(ins)
    return True


def fold_qdq(module: Module) -> None:
    """Rewrite every foldable `dot` / `convolution` of dequantised 8-bit values (see above)."""
    changed = False
    for ins in list(module.instructions):
        if ins.op.name in ("dot", "convolution") and len(ins.inputs) == 2:
            changed |= _fold(module, ins)
    if changed:
        dead_code_elimination(module)
