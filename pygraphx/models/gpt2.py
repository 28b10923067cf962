"""GPT-2 small (HuggingFace ``GPT2LMHeadModel`` layout) as an ONNX graph with random weights.

Part of the project's built-in model zoo (``pygraphx.models``), used by the driver's
``--model gpt2`` and by tests. The node pattern follows ``torch.onnx.export`` of a
HuggingFace ``GPT2LMHeadModel`` with eager attention and no KV cache, at opset 17:

* position ids from ``Range(0, Shape(input_ids)[1], 1)``; token + position Gather embeddings;
* pre-LN blocks (LayerNormalization eps 1e-5); ``c_attn`` as MatMul + Add to 3*768 then
  ``Split`` into q, k, v; heads split/merged by Reshape whose target shape comes from a
  ``Shape -> Gather -> Unsqueeze -> Concat`` chain, and Transpose;
* causal mask: a constant lower-triangular bool ``[1,1,1024,1024]`` buffer, sliced with ``Slice``
  (bounds computed from the q/k shapes) and applied with ``Where(mask, w, finfo.min)``, plus
  the additive padding mask built from ``attention_mask``;
* tanh-approximate GELU ``0.5*x*(1+Tanh(sqrt(2/pi)*(x+0.044715*Pow(x,3))))``;
* final LayerNorm and an lm_head tied to the token embedding: ``MatMul(h, Transpose(wte))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from pygraphx.models._builder import GraphBuilder
from pygraphx.models.bert import (
    TransformerConfig,
    extended_mask,
    layer_norm,
    linear,
    merge_heads,
    shape_dims,
    split_heads,
    start_graph,
)


@dataclass(frozen=True)
class GPT2Config(TransformerConfig):
    """Hyper-parameters of a GPT-2 decoder (defaults: gpt2 small)."""

    vocab_size: int = 50257
    n_positions: int = 1024
    ln_eps: float = 1e-5


GPT2_SMALL = GPT2Config()


def _causal_slice(gb: GraphBuilder, bias: str, q: str, k: str) -> str:
    """``bias[:, :, kl - ql : kl, :kl]`` with ql/kl read from the q/k shapes."""
    (ql,) = shape_dims(gb, q, (2,))
    (kl,) = shape_dims(gb, k, (2,))
    start = gb.op("Sub", kl, ql)
    starts = gb.op("Concat", start, gb.const([0], np.int64), axis=0)
    ends = gb.op("Concat", kl, kl, axis=0)
    return gb.op(
        "Slice", bias, starts, ends, gb.const([2, 3], np.int64), gb.const([1, 1], np.int64)
    )


def gelu_tanh(gb: GraphBuilder, x: str) -> str:
    """``0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))`` in exporter node order."""
    half = gb.op("Mul", gb.const(0.5, np.float32), x)
    cube = gb.op("Pow", x, gb.const(3.0, np.float32))
    inner = gb.op("Add", x, gb.op("Mul", gb.const(0.044715, np.float32), cube))
    inner = gb.op("Mul", gb.const(math.sqrt(2.0 / math.pi), np.float32), inner)
    t = gb.op("Add", gb.const(1.0, np.float32), gb.op("Tanh", inner))
    return gb.op("Mul", half, t)


def _block(gb: GraphBuilder, h: str, pad_mask: str, causal: str, cfg: GPT2Config) -> str:
    d = cfg.hidden
    std = cfg.init_std
    proj_std = std / math.sqrt(2.0 * cfg.layers)  # GPT-2's scaled residual projections
    with gb.scope("ln_1"):
        x = layer_norm(gb, h, d, cfg.ln_eps)
    with gb.scope("attn"):
        with gb.scope("c_attn"):
            qkv = linear(gb, x, d, 3 * d, std, "weight")
        q, k, v = gb.multi("Split", qkv, gb.const([d, d, d], np.int64), n=3, axis=2)
        q, k, v = (split_heads(gb, t, cfg.heads, d // cfg.heads) for t in (q, k, v))
        w = gb.op("MatMul", q, gb.op("Transpose", k, perm=[0, 1, 3, 2]))
        w = gb.op("Div", w, gb.const(math.sqrt(d // cfg.heads), np.float32))
        mask = _causal_slice(gb, causal, q, k)
        w = gb.op("Where", mask, w, gb.const(np.finfo(np.float32).min, np.float32))
        w = gb.op("Add", w, pad_mask)
        w = gb.op("Softmax", w, axis=-1)
        a = merge_heads(gb, gb.op("MatMul", w, v), d)
        with gb.scope("c_proj"):
            a = linear(gb, a, d, d, proj_std, "weight")
    h = gb.op("Add", a, h)
    with gb.scope("ln_2"):
        x = layer_norm(gb, h, d, cfg.ln_eps)
    with gb.scope("mlp"):
        with gb.scope("c_fc"):
            f = linear(gb, x, d, 4 * d, std, "weight")
        f = gelu_tanh(gb, f)
        with gb.scope("c_proj"):
            f = linear(gb, f, 4 * d, d, proj_std, "weight")
    return gb.op("Add", h, f)


def build_gpt2(
    *, batch: int = 1, seq_len: int = 128, seed: int = 0, config: GPT2Config = GPT2_SMALL
) -> onnx.ModelProto:
    """Build GPT-2 with an LM head; inputs ``input_ids`` and ``attention_mask``
    (int64 [batch, seq_len]); output ``logits`` [batch, seq_len, vocab]."""
    cfg = config
    gb, ids, mask_in = start_graph(batch, seq_len, seed, cfg.n_positions)
    std = cfg.init_std

    with gb.scope("transformer"):
        wte = gb.initializer(gb.normal((cfg.vocab_size, cfg.hidden), std), "wte.weight")
        wpe = gb.initializer(gb.normal((cfg.n_positions, cfg.hidden), std), "wpe.weight")
        tril = np.tril(np.ones((cfg.n_positions, cfg.n_positions), dtype=bool))
        causal = gb.initializer(tril[None, None], "h.attn.bias")

        shape = gb.op("Shape", ids)
        seq = gb.op("Gather", shape, gb.const(1, np.int64), axis=0)
        pos = gb.op("Range", gb.const(0, np.int64), seq, gb.const(1, np.int64))
        pos = gb.op("Unsqueeze", pos, gb.const([0], np.int64))
        with gb.scope("wte"):
            e = gb.op("Gather", wte, ids)
        with gb.scope("wpe"):
            p = gb.op("Gather", wpe, pos)
        h = gb.op("Add", e, p)
        pad_mask = extended_mask(gb, mask_in)

        for i in range(cfg.layers):
            with gb.scope("h", i):
                h = _block(gb, h, pad_mask, causal, cfg)
        with gb.scope("ln_f"):
            h = layer_norm(gb, h, cfg.hidden, cfg.ln_eps)

    with gb.scope("lm_head"):
        wt = gb.op("Transpose", wte, perm=[1, 0])
        gb.op("MatMul", h, wt, output="logits")
    gb.add_output("logits", np.float32, [batch, seq_len, cfg.vocab_size])
    return gb.build("gpt2", "HuggingFace GPT2LMHeadModel (small) layout, random weights")
