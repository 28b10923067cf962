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

`split_fp8_scales` runs after the fusion passes (the gpu target with `torch._scaled_mm`, issue
12): the fusion puts `mul`, `convert` and the bias `add` after an fp8 `quant_dot` with a
constant weight into the group that follows (a GELU, a residual add and layer norm), which
then reads the float32 sums. When the group starts with `mul(sums, column constant)` in
float32, `convert` to half or bf16 and optionally `add(that, column constant)` (the bias), those
become a group of their own, `pointwise(quant_dot, scale, bias)`, that the GEMM computes
(`_scaled_mm` with the scale and bias, half out: `targets/gpu/quant.py`), and the rest of the
group reads that half value, as in the fp16 program. The numbers of the program do not change
(the same ops in the same order); float32 programs (no `convert`) are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.instruction import Instruction, folded_sources
from pygraphx.ir.module import Module
from pygraphx.ir.program import Program
from pygraphx.ops.base import make_op
from pygraphx.ops.fused import PointwiseModule
from pygraphx.ops.quant import FP8_TYPES
from pygraphx.passes.dead_code_elimination import dead_code_elimination
from pygraphx.passes.fold_qdq import _channel_scales, _dequantised

__all__ = ["column_constant", "fold_fp8", "split_fp8_scales"]
#: the half types `split_fp8_scales` splits to (`_scaled_mm`'s half outputs)
HALF_TYPES = ("half_type", "bf16_type")


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


def fold_fp8(module: Module, convolutions: bool | Callable[[Instruction], bool] = True) -> None:
    """Rewrite every foldable `dot` (and, with `convolutions`, `convolution`; a function: those
    it accepts) of dequantised fp8 values (see the module docstring)."""
    changed = False
    for ins in list(module.instructions):
        if ins.op.name == "dot" and len(ins.inputs) == 2:
            changed |= _fold(module, ins)
        elif convolutions and ins.op.name == "convolution" and len(ins.inputs) == 2:
            wanted = ins.op.group == 1 and (convolutions is True or convolutions(ins))
            changed |= wanted and _fold(module, ins)
    if changed:
        dead_code_elimination(module)


def split_fp8_scales(module: Module, program: Program) -> None:
    """Give each fp8 `quant_dot` with a constant weight whose only user is a fused group
    starting with its scale `mul`, a `convert` to half or bf16 and optionally a bias `add` a
    `pointwise` group of those alone (module docstring); the rest of the group reads it."""
    if module.parent is not None:
        return
    for ins in list(module.instructions):
        if ins.op.name == "quant_dot" and len(ins.inputs) == 2:
            _split(module, program, ins)


def _behind(x: Instruction) -> np.ndarray | None:
    """The literal `x` broadcasts, reshapes or transposes, else None."""
    while x.op.name in ("multibroadcast", "broadcast", "reshape", "transpose", "contiguous"):
        x = x.inputs[0]
    return np.asarray(x.get_literal().array) if x.is_literal() else None


def column_constant(x: Instruction, n: int) -> np.ndarray | None:
    """The `n` values of `x` when it is a literal vector of `n` (along the last axis, other
    axes 1) broadcast to its lens, else None."""
    while x.op.name == "multibroadcast":
        x = x.inputs[0]
    if not x.is_literal():
        return None
    lens = list(x.shape.lens())
    if not lens or lens[-1] != n or any(d != 1 for d in lens[:-1]):
        return None
    return np.asarray(x.get_literal().array).reshape(n)


def _leading(group: Instruction, product: Instruction) -> list[Instruction] | None:
    """The body's `mul` of `product` by a column constant, its `convert` to half or bf16 and
    the bias `add` after it when there is one, else None."""
    body, n = group.module_inputs[0], product.shape.lens()[-1]
    params = {id(p): group.inputs[int(p.op.parameter[1:])] for p in body.get_parameters()}
    ours = [p for p in body.get_parameters() if params[id(p)] is product]
    if len(ours) != 1 or len(ours[0].outputs) != 1:
        return None
    mul = ours[0].outputs[0]

    def constant_operand(ins: Instruction, x: Instruction) -> bool:
        if ins.op.name not in ("mul", "add") or len(ins.inputs) != 2 or x not in ins.inputs:
            return False
        other = ins.inputs[1] if ins.inputs[0] is x else ins.inputs[0]
        if other is x or id(other) not in params:
            return False
        return column_constant(params[id(other)], n) is not None

    if not constant_operand(mul, ours[0]) or mul.op.name != "mul" or len(mul.outputs) != 1:
        return None
    convert = mul.outputs[0]
    if convert.op.name != "convert" or convert.shape.type() not in HALF_TYPES:
        return None
    steps = [mul, convert]
    add = convert.outputs[0] if len(convert.outputs) == 1 else None
    if add is not None and add.op.name == "add" and constant_operand(add, convert):
        steps.append(add)
    return steps


def _split(module: Module, program: Program, product: Instruction) -> bool:
    if product.inputs[0].shape.type() not in FP8_TYPES or _behind(product.inputs[1]) is None:
        return False
    if len(product.outputs) != 1:
        return False
    group = product.outputs[0]
    if group.op.name not in ("pointwise", "fused_reduce") or len(group.module_inputs) != 1:
        return False
    if sum(x is product for x in group.inputs) != 1:
        return False
    steps = _leading(group, product)
    if steps is None:
        return False
    old = group.module_inputs[0]
    lead_body, lead_inputs = _body_of(program, module, old, steps, group, None)
    lead = module.insert_instruction(group, PointwiseModule(), lead_inputs, [lead_body])
    lead.source = group.source
    rest = [i for i in old.instructions if i not in steps]
    if [i.op.name for i in rest if not i.is_param()] == ["@return"]:
        module.replace_instruction(group, lead)  # the group was the scale and bias alone
    else:
        body, inputs = _body_of(program, module, old, rest, group, (steps[-1], lead))
        rebuilt = module.insert_instruction(group, group.op, inputs, [body])
        rebuilt.source = group.source
        module.replace_instruction(group, rebuilt)
    module.remove_instruction(group)
    program.remove_module(old.name)
    return True


def _body_of(
    program: Program,
    module: Module,
    old: Module,
    keep: list[Instruction],
    group: Instruction,
    swap: tuple[Instruction, Instruction] | None,
) -> tuple[Module, list[Instruction]]:
    """(a new body running `keep` of the body `old` of `group`, the group inputs of its
    parameters); `swap`: (a body value, an instruction of `module`) that becomes a parameter
    reading that instruction; the values `keep` reads from outside it are parameters too. The
    body is named as the fusion passes name theirs (`main:pointwise3`, `main:fused_reduce1`)."""
    kind = group.op.name if swap is not None else "pointwise"
    body = program.create_module(_free_name(program, f"{module.name}:{kind}"), parent=module)
    kept = {id(i) for i in keep}
    mapping: dict[int, Instruction] = {}
    inputs: list[Instruction] = []

    def value(x: Instruction) -> Instruction:
        if id(x) not in mapping:
            if swap is not None and x is swap[0]:
                outside = swap[1]
            else:
                outside = group.inputs[int(x.op.parameter[1:])]
            mapping[id(x)] = body.add_parameter(f"x{len(inputs)}", outside.shape)
            inputs.append(outside)
        return mapping[id(x)]

    for ins in old.instructions:
        if id(ins) not in kept or ins.is_param():
            continue
        if ins.is_literal():
            mapping[id(ins)] = body.add_literal(ins.get_literal())
            continue
        args = [mapping[id(x)] if id(x) in kept and not x.is_param() else value(x)
                for x in ins.inputs]  # fmt: skip
        if ins.is_return():
            body.add_return(args)
        else:
            mapping[id(ins)] = body.add_instruction(ins.op, args, ins.module_inputs)
    if not any(i.is_return() for i in body.instructions):
        body.add_return([mapping[id(keep[-1])]])
    return body, inputs


def _free_name(program: Program, prefix: str) -> str:
    k = 0
    while f"{prefix}{k}" in program.modules:
        k += 1
    return f"{prefix}{k}"
