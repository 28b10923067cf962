"""The cpu target's lowerings, handed to `targets/torch_lowering` as `lowering_overrides`.

* `dot` and `fused_reduce`: attention blocks (`softmax(Q K^T * s + mask) V`) recognised and
  run as one `scaled_dot_product_attention` call (torch's fused CPU kernel: the score matrix
  is never written out), see `torch_lowering/attention.py`; every other product and reduction
  lowers as the torch lowering does.
* `concat`: a channel concat whose only user is a 1x1 convolution runs as one convolution
  per part summed into the convolution's output, where that is faster
  (`torch_lowering/conv_concat.py`); `resize`: a nearest upsample that is one of those parts
  runs inside that step, its convolution at the upsample's input size.
* `reduce_mean`: a layer normalisation it starts (the seven instructions ONNX's
  LayerNormalization becomes) runs as one `F.layer_norm` call, see
  `torch_lowering/layernorm.py`; a norm whose affine part went into a masked sum over the
  tokens (mean pooling after an encoder's last norm, MiniLM's) runs with that sum as one
  native step, see `torch_lowering/norm_pool.py`; `gather`: an encoder's embeddings summed
  and normalised (BERT's, MiniLM's first norm) run as one native step, see
  `torch_lowering/embed_norm.py`.

The settings `attention=False` and `layernorm=False` turn the recognition off (to compare).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.attention import with_attention
from pygraphx.targets.torch_lowering.context import LoweringContext
from pygraphx.targets.torch_lowering.conv_concat import lower_concat_or_sum, lower_resize_or_sum
from pygraphx.targets.torch_lowering.embed_norm import lower_embed_norm
from pygraphx.targets.torch_lowering.layernorm import lower_layernorm
from pygraphx.targets.torch_lowering.lower import LOWERINGS, _load_lowerings
from pygraphx.targets.torch_lowering.norm_pool import lower_norm_pool

Lowering = Callable[[LoweringContext, Instruction], bool]


def cpu_overrides(options: dict[str, Any]) -> dict[str, Lowering]:
    """Op name -> lowering for the cpu target (see the module docstring)."""
    _load_lowerings()
    overrides: dict[str, Lowering] = {"concat": lower_concat_or_sum, "resize": lower_resize_or_sum}
    if options.get("attention", True):
        overrides.update(with_attention(LOWERINGS["dot"], LOWERINGS["fused_reduce"]))
    if options.get("layernorm", True):
        reduce_mean = LOWERINGS["reduce_mean"]

        def lower_mean(ctx: LoweringContext, ins: Instruction) -> bool:
            return lower_layernorm(ctx, ins) or lower_norm_pool(ctx, ins) or reduce_mean(ctx, ins)

        overrides["reduce_mean"] = lower_mean
        gather = LOWERINGS["gather"]

        def lower_gather(ctx: LoweringContext, ins: Instruction) -> bool:
            return lower_embed_norm(ctx, ins) or gather(ctx, ins)

        overrides["gather"] = lower_gather
    return overrides
