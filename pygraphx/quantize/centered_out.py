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
residual); else nothing changes. `truncate_float.CENTER_LAST_OUT` / `PGX_BF16_CENTER_LAST_OUT`.
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
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
    if bias_add.op.name != "add" or len(bias_add.outputs) != 1:
        return None
    res_add = bias_add.outputs[0]
    if res_add.op.name != "add" or len(res_add.inputs) != 2:
        return None
    r = res_add.inputs[1] if res_add.inputs[0] is bias_add else res_add.inputs[0]
    if r.shape.lens() != dot.shape.lens() or view_source(r).is_literal():
        return None
    axis = len(lens) - 2
    m = module.insert_instruction(dot, make_op("reduce_mean", axes=(axis,)), [ctx])
    mb = module.insert_instruction(dot, make_op("multibroadcast", out_lens=tuple(lens)), [m])
    centered = module.insert_instruction(dot, make_op("sub"), [ctx, mb])
    mw = module.insert_instruction(dot, make_op("dot"), [m, w])
    out_lens = tuple(dot.shape.lens())
    mwb = module.insert_instruction(dot, make_op("multibroadcast", out_lens=out_lens), [mw])
    r2 = module.insert_instruction(res_add, make_op("add"), [r, mwb])
    module.replace_op(dot, dot.op, [centered, w])
    module.replace_op(res_add, res_add.op, [r2 if x is r else x for x in res_add.inputs])
    return mw
