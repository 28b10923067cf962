"""fold_qdq: turn `dot` / `convolution` of dequantised int8 values into integer products.

The pattern (what `quantize_int8` inserts, and ONNX QDQ models, e.g. ONNX Runtime's
`quantize_static` ones):

    dot(dequantizelinear(qa, sa[, za]), dequantizelinear(qb, sb))
    convolution(dequantizelinear(qx, sx[, zx]), dequantizelinear(qw, sw))

with 8-bit `qa`/`qx` and `qb`/`qw`, constant scales, the left one per tensor (one value
everywhere) with at most one constant zero point, and the right one per output channel
(varying only along the last axis of a `dot`'s right operand, or axis 0 of a convolution's
weights) without a zero point (or an all-zero one), becomes

    dequantizelinear(quant_dot(qa, qb) [- za * column sums of qb], s)   s[n] = sa * sb[n]
    dequantizelinear(quant_convolution(qx, qw[, zx]), s)    (broadcast along the channels)

so the product is exact int32 accumulation and the two scales are folded into one dequantise of
the result. The folded scale is the product of the two scales rounded once to the scale type.
A left zero point needs constant weights for a `dot` (their column sums are subtracted); a
convolution takes it as its third input (padding stays zero in real terms).

Dynamic quantisation (`quantize_int8(dynamic=True)`) gives a `dot` run-time scales: one per
row of the left operand (`multibroadcast` of a value whose last axis has length 1) and one
per column of a non-constant right operand (length 1 on axis -2); the folded scale is then
their product, computed at run time, `mul` of the two spread over the product's lens.
Anything else (a weight zero point, a per-row constant activation scale, a scale computed
some other way) is left as it is.
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.instruction import Instruction, folded_sources
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
    value of one of `types` with a constant scale (8-bit integers by default; `fold_fp8` asks
    for fp8)."""
    found = _dequantised_any(ins, types)
    if found is None or found[2] != 0 or isinstance(found[1], Instruction):
        return None
    return found[0], found[1]


def _dequantised_any(
    ins: Instruction, types: frozenset[str] = _EIGHT_BIT
) -> tuple[Instruction, np.ndarray | Instruction, int] | None:
    """(the quantised value, its scale, its zero point) when `ins` is a dequantizelinear of a
    value of one of `types` with one constant zero point (0 without one): the scale is a
    constant array, or, for a scale computed at run time, the value its multibroadcast
    spreads (the per-row / per-column scales of dynamic quantisation)."""
    if ins.op.name != "dequantizelinear" or ins.inputs[0].shape.type() not in types:
        return None
    zero_point = 0
    if len(ins.inputs) == 3:
        if not _is_constant(ins.inputs[2]):
            return None
        zp = np.asarray(evaluate_constant(ins.inputs[2], {}))
        if zp.size == 0 or np.any(zp != zp.flat[0]):
            return None
        zero_point = int(zp.flat[0])
    scale = ins.inputs[1]
    if _is_constant(scale):
        return ins.inputs[0], np.asarray(evaluate_constant(scale, {})), zero_point
    if scale.op.name == "multibroadcast":
        return ins.inputs[0], scale.inputs[0], zero_point
    return None


def _column_correction(qb: Instruction, zero_point: int) -> np.ndarray | None:
    """zero_point * (the column sums of the constant right operand `qb`), int32, one per output
    column: what `quant_dot(qa, qb)` has more than the product of `qa - zero_point` (None when
    `qb` is not constant or its columns differ across the batch)."""
    if not _is_constant(qb):
        return None
    sums = np.asarray(evaluate_constant(qb, {})).astype(np.int64).sum(axis=-2)
    flat = sums.reshape(-1, sums.shape[-1])
    if np.any(flat != flat[:1]):
        return None
    return (zero_point * flat[0]).astype(np.int32)


def _channel_scales(scale: np.ndarray, axis: int) -> np.ndarray | None:
    """The per-channel scale vector along `axis` when `scale` varies along no other axis."""
    moved = np.moveaxis(scale, axis, 0)
    vector = moved.reshape(moved.shape[0], -1)[:, 0]
    column = vector.reshape((-1,) + (1,) * (moved.ndim - 1))
    if not np.array_equal(moved, np.broadcast_to(column, moved.shape)):
        return None
    return vector


def _fold(module: Module, ins: Instruction) -> bool:
    left, right = (_dequantised_any(x) for x in ins.inputs)
    if left is None or right is None or right[2] != 0:
        return False  # a weight zero point is not folded
    (qa, sa, za), (qb, sb, _) = left, right
    is_dot = ins.op.name == "dot"
    if isinstance(sa, Instruction) or isinstance(sb, Instruction):
        return is_dot and za == 0 and _fold_runtime(module, ins, qa, sa, qb, sb)
    if sa.size == 0 or np.any(sa != sa.flat[0]):
        return False
    channels = _channel_scales(sb, sb.ndim - 1 if is_dot else 0)
    correction = _column_correction(qb, za) if is_dot and za else None
    if channels is None or (is_dot and za and correction is None):
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
        if correction is not None:  # (qa - za) @ qb = qa @ qb - za * column sums of qb
            view = module.insert_instruction(ins, spread, [module.insert_literal(ins, correction)])
            product = module.insert_instruction(ins, make_op("sub"), [product, view])
    else:  # the input's zero point is quant_convolution's third input
        zp = [module.insert_literal(ins, np.full(1, za, qa.shape.dtype()))] if za else []
        product = module.insert_instruction(
            ins, make_op("quant_convolution", **ins.op.attributes()), [qa, qb, *zp]
        )
    result = module.insert_instruction(ins, make_op("dequantizelinear"), [product, scale])
    product.source = result.source = folded_sources(ins)  # the dequantised inputs' nodes too
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
    product.source = result.source = folded_sources(ins)  # the dequantised inputs' nodes too
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
