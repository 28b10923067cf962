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


def _dequantised(
    ins: Instruction, types: frozenset[str] = _EIGHT_BIT
) -> tuple[Instruction, np.ndarray] | None:
    """(the quantised value, its scale array) when `ins` is a symmetric dequantizelinear of a
    value of one of `types` (8-bit integers by default; `fold_fp8` asks for fp8)."""
    if ins.op.name != "dequantizelinear" or ins.inputs[0].shape.type() not in types:
        return None
    if not all(_is_constant(x) for x in ins.inputs[1:]):
        return None
    if len(ins.inputs) == 3 and np.any(evaluate_constant(ins.inputs[2], {}) != 0):
        return None
    return ins.inputs[0], np.asarray(evaluate_constant(ins.inputs[1], {}))


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


def fold_qdq(module: Module) -> None:
    """Rewrite every foldable `dot` / `convolution` of dequantised 8-bit values (see above)."""
    changed = False
    for ins in list(module.instructions):
        if ins.op.name in ("dot", "convolution") and len(ins.inputs) == 2:
            changed |= _fold(module, ins)
    if changed:
        dead_code_elimination(module)
