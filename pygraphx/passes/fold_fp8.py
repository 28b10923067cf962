"""fold_fp8: turn `dot` of dequantised fp8 e4m3 values into an fp8 product (for fp8 GEMMs).

`quantize_fp8` leaves its products as `dot(dequantizelinear(qa, sa), dequantizelinear(qw, sw))`
(the `ref` target's exact oracle of fp8 inference). A target with fp8 GEMM kernels (the gpu
target: `torch._scaled_mm`) runs this pass first, before constant propagation folds the
weight's dequantise into a float literal. With `qa`, `qw` of one fp8 type, no zero point, `sa`
one value and `sw` varying only along the last axis (per output column), it becomes

    convert(mul(quant_dot(qa, qw), s))        s[n] = float32(sa) * float32(sw[n])

`quant_dot` of fp8 inputs is the float32 sum of exact fp8 products, `mul` applies the folded
scale in float32 (an element-wise op, so the fusion passes merge it with the bias and
activation after it), and `convert` (only when the `dot` was half or bf16, e.g. after
`quantize_fp16`) gives the original type back. In a float32 program the result differs from
the `dot` of the dequantised values by float rounding only (the scales multiply the sum
instead of each term); in a half one the `dot` rounded each dequantised operand to half first,
which this skips (so it is closer to exact fp8 maths, and a value the next fp8 quantisation
sees may land one fp8 step away from the reference's).
A `convolution` (one group) of dequantised fp8 values folds the same way, with the weight's
scale varying along its axis 0 (per output channel) and `s` broadcast along the result's
channels (axis 1): `convert(mul(quant_convolution(qa, qw), s))`, the float32 sums of exact fp8
products (the gpu target's fp8 implicit-GEMM kernel, `targets/gpu/quant_conv.py`).
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.instruction import Instruction, folded_sources
from pygraphx.ir.module import Module
from pygraphx.ops.base import make_op
from pygraphx.ops.quant import FP8_TYPES
from pygraphx.passes.dead_code_elimination import dead_code_elimination
from pygraphx.passes.fold_qdq import _channel_scales, _dequantised

__all__ = ["fold_fp8"]


def _fold(module: Module, ins: Instruction) -> bool:
    left, right = (_dequantised(x, FP8_TYPES) for x in ins.inputs)
    if left is None or right is None:
        return False
    (qa, sa), (qb, sb) = left, right
    if qa.shape.type() != qb.shape.type() or sa.size == 0 or np.any(sa != sa.flat[0]):
        return False
    conv = ins.op.name == "convolution"
    columns = _channel_scales(sb, 0 if conv else sb.ndim - 1)
    if columns is None:
        return False
    folded = (np.float64(sa.flat[0]) * columns.astype(np.float64)).astype(np.float32)
    lens = tuple(ins.shape.lens())
    vector = module.insert_literal(ins, Literal(folded))
    if conv:
        spread = make_op("broadcast", axis=1, out_lens=lens)
        scale = module.insert_instruction(ins, spread, [vector])
        quant = make_op("quant_convolution", **ins.op.attributes())
        product = module.insert_instruction(ins, quant, [qa, qb])
    else:
        scale = module.insert_instruction(ins, make_op("multibroadcast", out_lens=lens), [vector])
        product = module.insert_instruction(ins, make_op("quant_dot"), [qa, qb])
    result = module.insert_instruction(ins, make_op("mul"), [product, scale])
    if ins.shape.type() != "float_type":
        convert = make_op("convert", target_type=ins.shape.type())
        result = module.insert_instruction(ins, convert, [result])
    product.source = result.source = folded_sources(ins)  # the dequantised inputs' nodes too
    module.replace_instruction(ins, result)
    module.remove_instruction(ins)
    return True


def fold_fp8(module: Module, convolutions: bool = True) -> None:
    """Rewrite every foldable `dot` (and, with `convolutions`, `convolution`) of dequantised fp8
    values (see the module docstring)."""
    changed = False
    for ins in list(module.instructions):
        if ins.op.name == "dot" and len(ins.inputs) == 2:
            changed |= _fold(module, ins)
        elif convolutions and ins.op.name == "convolution" and len(ins.inputs) == 2:
            changed |= ins.op.group == 1 and _fold(module, ins)
    if changed:
        dead_code_elimination(module)
