"""centered_out: the last attention's output projection on its input's deviation from the mean
over the tokens, the mean's own product in float32 (helper acc16, issue 10).

`y = ctx @ W + b + r` becomes `y = (ctx - m) @ W + b + (r + m @ W)`, `m = mean(ctx)` over the
token axis (the next-to-last): the same value in exact arithmetic. In bf16 the big product
rounds `ctx - m` and `W`, whose error `(ctx - m) @ dW` changes from token to token and averages
out in a pooled output, while `m @ W` (one row a sequence) stays float32 (`truncate_float`
keeps it wide): the error `m @ dW`, the same for every token, which a mean over the tokens
keeps, is not made. The rounding of `ctx - m` is smaller than that of `ctx` too.

Why the last attention's (`truncate_float.last_attention_out`): on MiniLM the last layer's
out-projection weights are the largest single part of the bf16 error of the sentence embedding
(the mean over the tokens), its context having a mean of norm ~2.5 against ~6 a token; the
earlier layers' matter 2-4x less, and each centring costs ~0.3-0.6 % of MiniLM's time (a mean,
a subtraction, a 1-row product, an add over the residual: `benchmarks/results/acc16.md`).

Where: `dot(ctx, W)` with `W` a view of a constant and `ctx` of 3 or more axes, whose one user
adds (a bias) and whose user in turn adds a run-time value `r` of the product's shape (the
residual); else nothing changes (not a bias-less projection followed by a norm, as Llama's;
not a 2-D product; not a sequence of one token; not where the product stays wide anyway). The
token axis is taken as the next-to-last. A mean that is not finite (a NaN row: softmax over a
query that sees no key) is taken as 0, so that row's NaN stays its own. For fp16 products
(`quantize_fp16(prog, ["products"])`) it applies alike. In a causal decoder a token's rounding
now depends on the later tokens of the same chunk (exact in real arithmetic; a prefill and an
incremental decode round differently). `truncate_float.CENTER_LAST_OUT` /
`PGX_BF16_CENTER_LAST_OUT` (read once when the program is quantized).
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ir.shape import to_dtype
from pygraphx.ops.base import make_op
from pygraphx.ops.literal_views import view_source

__all__ = ["center_product"]


def center_product(module: Module, dot: Instruction) -> Instruction | None:
    """Rewrite `dot` (`ctx @ W`, then `+ b`, then `+ r`) as the module docstring says; returns
    the mean's product (to be kept float32), or None where the shape does not match."""
    ctx, w = dot.inputs
    lens = list(ctx.shape.lens())
    if len(lens) < 3 or not view_source(w).is_literal() or len(dot.outputs) != 1:
        return None
    bias_add = dot.outputs[0]
    # (a user is listed once however many of its inputs it reads: `add(dot, dot)` is not a bias)
    if bias_add.op.name != "add" or len(bias_add.outputs) != 1 or bias_add.inputs.count(dot) != 1:
        return None
    res_add = bias_add.outputs[0]
    if res_add.op.name != "add" or res_add.inputs.count(bias_add) != 1:
        return None
    r = res_add.inputs[1] if res_add.inputs[0] is bias_add else res_add.inputs[0]
    if r.shape.lens() != dot.shape.lens() or view_source(r).is_literal():
        return None
    axis = len(lens) - 2
    if lens[axis] == 1:  # one token (a decode step): ctx - m is 0, nothing to gain
        return None
    m = _finite_mean(module, dot, ctx, axis)
    mb = module.insert_instruction(dot, make_op("multibroadcast", out_lens=tuple(lens)), [m])
    centered = module.insert_instruction(dot, make_op("sub"), [ctx, mb])
    mw = module.insert_instruction(dot, make_op("dot"), [m, w])
    out_lens = tuple(dot.shape.lens())
    mwb = module.insert_instruction(dot, make_op("multibroadcast", out_lens=out_lens), [mw])
    r2 = module.insert_instruction(res_add, make_op("add"), [r, mwb])
    module.replace_op(dot, dot.op, [centered, w])
    module.replace_op(res_add, res_add.op, [r2 if x is r else x for x in res_add.inputs])
    return mw


def _finite_mean(module: Module, before: Instruction, ctx: Instruction, axis: int) -> Instruction:
    """The mean of `ctx` over `axis`, 0 where it is not finite: a sequence with a NaN / inf row
    (softmax over a query row that sees no key, as left-padded prefill gives) is then computed
    uncentred, its non-finite rows staying in themselves instead of spreading to every token."""
    m0 = module.insert_instruction(before, make_op("reduce_mean", axes=(axis,)), [ctx])
    lens = tuple(m0.shape.lens())
    diff = module.insert_instruction(before, make_op("sub"), [m0, m0])  # NaN where m0 is not finite
    bad = module.insert_instruction(before, make_op("isnan"), [diff])
    zero = module.insert_literal(before, np.zeros((), dtype=to_dtype(m0.shape.type())))
    zeros = module.insert_instruction(before, make_op("multibroadcast", out_lens=lens), [zero])
    return module.insert_instruction(before, make_op("where"), [bad, zeros, m0])
