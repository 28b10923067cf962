"""What a chain of views of a literal repeats: `view_source` (where the chain starts) and
`wide_vector` (the float32 value of a rounded bias that a broadcast view repeats).

Both the quantizer (`pygraphx.quantize`: which constants a product reads) and the targets' lowerings
(`torch_lowering.conv_fusion` / `gemm_kernels`: a bf16 product's float32 bias) ask these; they
sit here, below both layers.
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.argument import RoundedLiteral
from pygraphx.ir.instruction import Instruction
from pygraphx.ops.base import ViewOp

__all__ = ["is_vector", "view_source", "wide_vector"]


def view_source(ins: Instruction) -> Instruction:
    """Where a chain of one-input views (no module calls) ending at `ins` starts."""
    while isinstance(ins.op, ViewOp) and len(ins.inputs) == 1 and not ins.module_inputs:
        ins = ins.inputs[0]
    return ins


def is_vector(arr: np.ndarray) -> bool:
    """`arr` has at most one axis of more than one value (a bias, a scale; not a weight)."""
    return sum(d > 1 for d in arr.shape) <= 1


def wide_vector(ins: Instruction, n: int) -> np.ndarray | None:
    """The float32 value of the (n,) vector that `ins` (a view of a `RoundedLiteral` holding n
    values, e.g. a broadcast bias) repeats, or None."""
    src = view_source(ins)
    if not src.is_literal():
        return None
    lit = src.get_literal()
    wide = lit.wide if isinstance(lit, RoundedLiteral) else None
    # a vector: every view of it (a broadcast, a reshape) repeats it in its order
    if wide is None or wide.size != n or not is_vector(wide):
        return None
    return wide.reshape(n)
