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
    values, e.g. a broadcast bias) repeats, or None.

    Checked, not assumed: the view chain is evaluated on the literal's rounded values (numpy
    views, at compile time), and the wide vector is given only where rounding it gives the
    view's values along one of its axes of n values, repeated along the others (a view that
    reorders the vector, or slices part of it and repeats that, gets None: the caller then
    uses the rounded values). Two entries that round alike could still trade places unseen;
    each's float32 value is then within one low-precision unit of the right one."""
    chain = []
    src = ins
    while isinstance(src.op, ViewOp) and len(src.inputs) == 1 and not src.module_inputs:
        chain.append(src)
        src = src.inputs[0]
    if not src.is_literal():
        return None
    lit = src.get_literal()
    wide = lit.wide if isinstance(lit, RoundedLiteral) else None
    if wide is None or wide.size != n or not is_vector(wide):
        return None
    view = lit.array
    for step in reversed(chain):
        view = np.asarray(step.op.compute(step.shape, [view]))
    vec = wide.reshape(n)
    return vec if _repeats(view, vec.astype(lit.array.dtype)) else None


def _repeats(view: np.ndarray, vec: np.ndarray) -> bool:
    """`view` holds `vec` along one of its axes (in order) and repeats it along the others:
    compared bit for bit (the rounding that made the literal is the one applied to `vec`)."""
    bits = np.dtype(f"u{vec.dtype.itemsize}")
    view, vec = view.view(bits), vec.view(bits)
    if view.size == 0 or view.ndim == 0:
        return view.size == 1 and vec.size == 1 and bool(view == vec[0])
    # a broadcast axis (stride 0) repeats one value: one of it is enough to compare
    view = view[tuple(slice(0, 1) if s == 0 else slice(None) for s in view.strides)]
    n = vec.size
    axes = [a for a in range(view.ndim) if view.shape[a] == n] if n > 1 else [0]
    for axis in axes:
        shape = [1] * view.ndim
        shape[axis] = n
        if np.array_equal(np.broadcast_to(vec.reshape(shape), view.shape), view):
            return True
    return False
