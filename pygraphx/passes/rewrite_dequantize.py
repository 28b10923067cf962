"""rewrite_dequantize: a quantised activation's `dequantizelinear` read by an element-wise op
becomes element-wise maths, so the fusion passes put it into that op's group.

`quantize_int8(..., residuals=True)` (`quantize/residual.py`) leaves a residual add reading
`dequantizelinear(q, s)` of the 8-bit tensor `q` that the next product reads too. As its own
instruction the dequantise is a step writing a float tensor that the add's group then reads:
the bytes the 8-bit residual was meant to save. Written as

    convert(mul(convert(q, float32), s32), type of s)     (the last convert only for half / bf16)

(`s32`: `s` converted to float32 when it is not), the same numbers as `dequantizelinear`
(`ops/quant.py`: float32 maths, rounded to the scale's type), `fuse_pointwise` merges the
three ops into the add's group, and a target reads `q` there: the gpu target's product
epilogue recognises `convert`, `mul` by a constant and `convert` as the residual's dequantise
(`targets/gpu/quant_epilogue.py`), a generated group kernel computes them in its own pass.

MIGraphX lowers every quantize / dequantize to such element-wise ops
(`rewrite_quantization`); here only these are: one symmetric (no zero point) dequantise of an
int8 or fp8 e4m3 `quantizelinear` output, with a float32 / half / bf16 scale, whose only user is
element-wise. Products' dequantises stay (`fold_qdq` / `fold_fp8` and the targets' GEMM
epilogues read them).
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops.base import make_op
from pygraphx.ops.pointwise import Pointwise

__all__ = ["rewrite_dequantize"]

#: the 8-bit types whose dequantise is rewritten, and the scale types it keeps
QUANTISED = ("int8_type", "fp8e4m3fn_type")
FLOATS = ("float_type", "half_type", "bf16_type")


def rewrite_dequantize(module: Module) -> None:
    """Rewrite each qualifying `dequantizelinear` of `module` (module docstring) in place."""
    for ins in list(module.instructions):
        if _qualifies(ins):
            _rewrite(module, ins)


def _qualifies(ins: Instruction) -> bool:
    if ins.op.name != "dequantizelinear" or len(ins.inputs) != 2:
        return False
    q, s = ins.inputs
    if q.op.name != "quantizelinear" or q.shape.type() not in QUANTISED:
        return False
    if s.shape.type() not in FLOATS or len(ins.outputs) != 1:
        return False
    return isinstance(ins.outputs[0].op, Pointwise)


def _rewrite(module: Module, ins: Instruction) -> None:
    q, s = ins.inputs
    to_float = make_op("convert", target_type="float_type")
    value = module.insert_instruction(ins, to_float, [q])
    s = _float32(module, ins, s)
    value = module.insert_instruction(ins, make_op("mul"), [value, s])
    if ins.shape.type() != "float_type":
        value = module.insert_instruction(
            ins, make_op("convert", target_type=ins.shape.type()), [value]
        )
    module.replace_instruction(ins, value)
    module.remove_instruction(ins)


def _float32(module: Module, before: Instruction, s: Instruction) -> Instruction:
    """`s` in float32: converted under its broadcasts (so a constant scale stays a small
    literal broadcast, which the epilogues read as a channel vector)."""
    if s.shape.type() == "float_type":
        return s
    if s.op.name in ("broadcast", "multibroadcast") and len(s.inputs) == 1:
        inner = _float32(module, before, s.inputs[0])
        return module.insert_instruction(before, s.op, [inner])
    return module.insert_instruction(before, make_op("convert", target_type="float_type"), [s])
