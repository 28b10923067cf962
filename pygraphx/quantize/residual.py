"""Which residual adds `quantize_int8(..., residuals=True)` / `quantize_fp8` quantise.

A residual network adds a block's input (or a shortcut product) to the output of its last
product: `relu(conv(x) + bias + r)`. Quantising only the products' inputs, as MIGraphX's
`quantize_int8` does, leaves `r` in float: a kernel running the last product with its
epilogue then reads `r` in the float type and, because the block's output is both the next
product's quantised input and the next block's float residual, writes it twice (float and
8-bit). That is where ResNet-50's int8 convolutions lost to cuDNN's fused half ones on an H100
(the 1x1 expansions with the residual: up to 1.38x their time; `benchmarks/results/
h100_int8res_layers_session8_last.md`).

With `residuals=True` the residual operand `r` of such an add is quantised too (one calibrated
scale per tensor, as every activation): the add reads `dequantizelinear(quantizelinear(r))`.
Where `r` is already a quantised product's input (a block's input is the next block's first
product's input) it is the same quantised tensor, so the block's output is needed only as 8-bit
values. This is where TensorRT's explicit-quantisation guide places a residual's Q/DQ pair and
what ONNX Runtime's static quantiser does for `Add`; it costs one more rounding of `r`
(`verify --int8` reports the accuracy).

An add qualifies when both operands are float activations of its shape and at least one is a
quantised product's output through element-wise steps with constants (bias, scale, ReLU,
convert). The operand quantised is the other one; where both are products (a stage's first
block: the shortcut convolution and the last one), it is the one computed first, so the
product computed last can take the add as its epilogue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module

__all__ = ["residual_adds"]

#: element-wise steps a product's output may pass through before the add (with constants)
_THROUGH = frozenset({"add", "mul", "sub", "relu", "convert", "clip"})


def residual_adds(
    main: Module, products: Iterable[Instruction], is_constant: Callable[[Instruction], bool]
) -> list[tuple[Instruction, int]]:
    """(add, index of the operand to quantise) for each qualifying add of `main` (module
    docstring), `products` the instructions whose inputs are quantised."""
    ids = {id(p) for p in products}
    found = []
    for ins in main.instructions:
        if ins.op.name != "add" or len(ins.inputs) != 2 or ins.shape.type() != "float_type":
            continue
        a, b = ins.inputs
        if a is b or any(is_constant(x) for x in (a, b)):
            continue
        if any(not _same_shape(x, ins) for x in (a, b)):
            continue
        pa, pb = _from_product(a, ids, is_constant), _from_product(b, ids, is_constant)
        if not (pa or pb):
            continue
        if pa and pb:  # two products: the one computed first is read by the other's epilogue
            index = 0 if main.position(a) < main.position(b) else 1
        else:
            index = 1 if pa else 0
        found.append((ins, index))
    return found


def _same_shape(x: Instruction, ins: Instruction) -> bool:
    return x.shape.lens() == ins.shape.lens() and x.shape.type() == "float_type"


def _from_product(x: Instruction, ids: set[int], is_constant) -> bool:
    """Whether `x` is a quantised product's output through element-wise steps whose other
    operands are constants."""
    while id(x) not in ids:
        if x.op.name not in _THROUGH or not x.inputs:
            return False
        live = [i for i in x.inputs if not is_constant(i)]
        if len(live) != 1:
            return False
        x = live[0]
    return True
