"""Fold inference batch norms into the convolutions before them, ahead of quantisation.

`convolution(x, W)` followed by `batch_norm_inference` (constant scale, bias, mean and variance,
per channel) is `convolution(x, W * a) + b` with `a = scale / sqrt(var + eps)` and
`b = bias - mean * a` (float32, as the operator computes them). Quantising the folded weights
(per output channel) is what int8 inference engines do, and it leaves the quantised convolution
followed by a plain bias add that the `cpu` target runs inside oneDNN's int8 convolution
(with the ReLU after it) instead of a separate multiply-add pass over the activations.
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops.base import make_op
from pygraphx.passes.pattern import const_value

__all__ = ["fold_batch_norms"]


def _foldable(bn: Instruction) -> list[np.ndarray] | None:
    """[W, scale, bias, mean, var] when `bn` is a per-channel float32 batch norm of a
    single-use convolution, all constants (literals or broadcast literals), else None."""
    conv = bn.inputs[0]
    if bn.op.bn_mode != 1 or conv.op.name != "convolution" or len(conv.outputs) != 1:
        return None
    if conv.shape.type() != "float_type" or len(conv.inputs) != 2:
        return None
    values = [const_value(x) for x in [conv.inputs[1], *bn.inputs[1:]]]
    if any(v is None for v in values):
        return None
    return values


def fold_batch_norms(module: Module) -> int:
    """Fold every foldable `batch_norm_inference` into its convolution; returns how many."""
    folded = 0
    for bn in list(module.instructions):
        if bn.op.name != "batch_norm_inference":
            continue
        values = _foldable(bn)
        if values is None:
            continue
        scale, bias, mean, var = (np.asarray(v, dtype=np.float32).reshape(-1) for v in values[1:])
        w = np.asarray(values[0], dtype=np.float32)
        a = (scale / np.sqrt(var + np.float32(bn.op.epsilon))).astype(np.float32)
        b = (bias - mean * a).astype(np.float32)
        conv = bn.inputs[0]
        weights = module.insert_literal(conv, Literal(w * a.reshape((-1,) + (1,) * (w.ndim - 1))))
        new_conv = module.insert_instruction(conv, conv.op, [conv.inputs[0], weights])
        lens = tuple(bn.shape.lens())
        vector = module.insert_literal(bn, Literal(b))
        spread = module.insert_instruction(
            bn, make_op("broadcast", axis=1, out_lens=lens), [vector]
        )
        added = module.insert_instruction(bn, make_op("add"), [new_conv, spread])
        module.replace_instruction(bn, added)
        module.remove_instruction(bn)
        module.remove_instruction(conv)
        folded += 1
    return folded
