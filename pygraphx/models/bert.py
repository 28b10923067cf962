"""BERT-base (HuggingFace ``BertModel`` layout) written as an ONNX graph with random weights.

Part of the project's built-in model zoo (``pygraphx.models``), used by the driver's
``--model bert_base`` and by tests. The node pattern follows ``torch.onnx.export`` of a
HuggingFace ``BertModel`` with eager attention at opset 17:

* embeddings: Gather (word / position / token type) -> Add -> LayerNormalization(eps 1e-12);
  position ids are a Slice of a constant ``[1, 512]`` buffer up to ``Shape(input_ids)[1]``;
* extended mask: Unsqueeze -> Unsqueeze -> Cast -> Sub(1, m) -> Mul(finfo(float32).min);
* self-attention: MatMul + Add linears, heads split by Reshape whose target shape comes from a
  ``Shape -> Gather -> Unsqueeze -> Concat`` chain, Transpose, MatMul(Q, K^T), Div(8),
  Add(mask), Softmax(-1), MatMul(V), Transpose back and Reshape (again a Shape chain);
* feed-forward with exact GELU ``Div(sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5``;
* pooler: Gather(CLS, axis=1) -> Gemm(transB=1) -> Tanh.

The shape chains are deliberate: they exercise the frontend's static-shape folding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from pygraphx.models._builder import GraphBuilder


@dataclass(frozen=True)
class TransformerConfig:
    """The hyper-parameters BERT and GPT-2 share (defaults: the base / small sizes)."""

    hidden: int = 768
    layers: int = 12
    heads: int = 12
    init_std: float = 0.02


@dataclass(frozen=True)
class BertConfig(TransformerConfig):
    """Hyper-parameters of a BERT encoder (defaults: bert-base-uncased)."""

    vocab_size: int = 30522
    intermediate: int = 3072
    max_position: int = 512
    type_vocab: int = 2
    ln_eps: float = 1e-12


BERT_BASE = BertConfig()


def linear(
    gb: GraphBuilder, x: str, din: int, dout: int, std: float, weight_name: str = "weight.T"
) -> str:
    """``x @ W + b`` as exported for a 3-D input: weight stored [din, dout], bias first in Add.

    Biases get the weights' std (HF initialises them to zero) so a dropped bias shows up."""
    w = gb.initializer(gb.normal((din, dout), std), weight_name)
    b = gb.initializer(gb.normal((dout,), std), "bias")
    return gb.op("Add", b, gb.op("MatMul", x, w))


def layer_norm(gb: GraphBuilder, x: str, dim: int, eps: float, output: str | None = None) -> str:
    """LayerNormalization over the last axis; weight ~1 and bias ~0 with a little noise."""
    w = gb.initializer(gb.normal((dim,), 0.02, 1.0), "weight")
    b = gb.initializer(gb.normal((dim,), 0.02), "bias")
    return gb.op("LayerNormalization", x, w, b, output=output, axis=-1, epsilon=eps)


def shape_dims(gb: GraphBuilder, x: str, axes: tuple[int, ...]) -> list[str]:
    """Exporter-style ``x.size(i)`` chain: Shape -> Gather(i) -> Unsqueeze, one per axis."""
    shape = gb.op("Shape", x)
    dims = []
    for ax in axes:
        d = gb.op("Gather", shape, gb.const(ax, np.int64), axis=0)
        dims.append(gb.op("Unsqueeze", d, gb.const([0], np.int64)))
    return dims


def split_heads(gb: GraphBuilder, x: str, heads: int, head_dim: int) -> str:
    """[B,S,H*D] -> Reshape(B,S,H,D) (shape from a Shape chain) -> Transpose(0,2,1,3)."""
    b, s = shape_dims(gb, x, (0, 1))
    target = gb.op(
        "Concat", b, s, gb.const([heads], np.int64), gb.const([head_dim], np.int64), axis=0
    )
    return gb.op("Transpose", gb.op("Reshape", x, target), perm=[0, 2, 1, 3])


def merge_heads(gb: GraphBuilder, x: str, hidden: int) -> str:
    """[B,H,S,D] -> Transpose(0,2,1,3) -> Reshape(B,S,H*D) (shape from a Shape chain)."""
    t = gb.op("Transpose", x, perm=[0, 2, 1, 3])
    b, s = shape_dims(gb, t, (0, 1))
    target = gb.op("Concat", b, s, gb.const([hidden], np.int64), axis=0)
    return gb.op("Reshape", t, target)


def gelu_erf(gb: GraphBuilder, x: str) -> str:
    """Exact GELU: ``x * 0.5 * (1 + erf(x / sqrt(2)))`` in exporter node order."""
    e = gb.op("Erf", gb.op("Div", x, gb.const(1.4142135, np.float32)))
    y = gb.op("Mul", x, gb.op("Add", e, gb.const(1.0, np.float32)))
    return gb.op("Mul", y, gb.const(0.5, np.float32))


def start_graph(
    batch: int, seq_len: int, seed: int, max_position: int
) -> tuple[GraphBuilder, str, str]:
    """A graph builder with the int64 [batch, seq_len] inputs ``input_ids`` and
    ``attention_mask`` (their names), for a model of at most `max_position` positions."""
    if not 1 <= seq_len <= max_position:
        raise ValueError(f"seq_len must be in [1, {max_position}], got {seq_len}")
    gb = GraphBuilder(seed)
    ids = gb.add_input("input_ids", np.int64, [batch, seq_len])
    mask = gb.add_input("attention_mask", np.int64, [batch, seq_len])
    return gb, ids, mask


def extended_mask(gb: GraphBuilder, mask: str) -> str:
    """[B,S] int64 mask -> [B,1,1,S] float additive mask ``(1 - m) * finfo.min``."""
    m = gb.op("Unsqueeze", mask, gb.const([1], np.int64))
    m = gb.op("Unsqueeze", m, gb.const([2], np.int64))
    m = gb.op("Cast", m, to=onnx.TensorProto.FLOAT)
    m = gb.op("Sub", gb.const(1.0, np.float32), m)
    return gb.op("Mul", m, gb.const(np.finfo(np.float32).min, np.float32))


def _bert_layer(
    gb: GraphBuilder, h: str, mask: str, cfg: BertConfig, output: str | None = None
) -> str:
    head_dim = cfg.hidden // cfg.heads
    std = cfg.init_std
    with gb.scope("attention"):
        with gb.scope("self"):
            with gb.scope("query"):
                q = linear(gb, h, cfg.hidden, cfg.hidden, std)
            with gb.scope("key"):
                k = linear(gb, h, cfg.hidden, cfg.hidden, std)
            with gb.scope("value"):
                v = linear(gb, h, cfg.hidden, cfg.hidden, std)
            q = split_heads(gb, q, cfg.heads, head_dim)
            k = split_heads(gb, k, cfg.heads, head_dim)
            v = split_heads(gb, v, cfg.heads, head_dim)
            kt = gb.op("Transpose", k, perm=[0, 1, 3, 2])
            scores = gb.op("MatMul", q, kt)
            scores = gb.op("Div", scores, gb.const(math.sqrt(head_dim), np.float32))
            scores = gb.op("Add", scores, mask)
            probs = gb.op("Softmax", scores, axis=-1)
            ctx = merge_heads(gb, gb.op("MatMul", probs, v), cfg.hidden)
        with gb.scope("output"):
            with gb.scope("dense"):
                a = linear(gb, ctx, cfg.hidden, cfg.hidden, std)
            a = gb.op("Add", a, h)
            with gb.scope("LayerNorm"):
                h = layer_norm(gb, a, cfg.hidden, cfg.ln_eps)
    with gb.scope("intermediate"):
        with gb.scope("dense"):
            f = linear(gb, h, cfg.hidden, cfg.intermediate, std)
        f = gelu_erf(gb, f)
    with gb.scope("output"):
        with gb.scope("dense"):
            f = linear(gb, f, cfg.intermediate, cfg.hidden, std)
        f = gb.op("Add", f, h)
        with gb.scope("LayerNorm"):
            return layer_norm(gb, f, cfg.hidden, cfg.ln_eps, output)


def build_bert(
    *, batch: int = 1, seq_len: int = 128, seed: int = 0, config: BertConfig = BERT_BASE
) -> onnx.ModelProto:
    """Build a BERT encoder + pooler; inputs ``input_ids``, ``attention_mask``,
    ``token_type_ids`` (int64 [batch, seq_len]); outputs ``last_hidden_state`` and
    ``pooler_output``."""
    cfg = config
    gb, ids, mask_in = start_graph(batch, seq_len, seed, cfg.max_position)
    types = gb.add_input("token_type_ids", np.int64, [batch, seq_len])
    std = cfg.init_std

    with gb.scope("embeddings"):
        word = gb.initializer(
            gb.normal((cfg.vocab_size, cfg.hidden), std), "word_embeddings.weight"
        )
        pos = gb.initializer(
            gb.normal((cfg.max_position, cfg.hidden), std), "position_embeddings.weight"
        )
        tok = gb.initializer(
            gb.normal((cfg.type_vocab, cfg.hidden), std), "token_type_embeddings.weight"
        )
        pos_buf = gb.initializer(
            np.arange(cfg.max_position, dtype=np.int64)[None, :], "position_ids"
        )
        (seq,) = shape_dims(gb, ids, (1,))
        pos_ids = gb.op(
            "Slice",
            pos_buf,
            gb.const([0], np.int64),
            seq,
            gb.const([1], np.int64),
            gb.const([1], np.int64),
        )
        with gb.scope("word_embeddings"):
            e = gb.op("Gather", word, ids)
        with gb.scope("token_type_embeddings"):
            t = gb.op("Gather", tok, types)
        e = gb.op("Add", e, t)
        with gb.scope("position_embeddings"):
            p = gb.op("Gather", pos, pos_ids)
        e = gb.op("Add", e, p)
        with gb.scope("LayerNorm"):
            h = layer_norm(gb, e, cfg.hidden, cfg.ln_eps)

    mask = extended_mask(gb, mask_in)
    with gb.scope("encoder"):
        for i in range(cfg.layers):
            with gb.scope("layer", i):
                last = i == cfg.layers - 1
                h = _bert_layer(gb, h, mask, cfg, "last_hidden_state" if last else None)

    with gb.scope("pooler"):
        cls = gb.op("Gather", h, gb.const(0, np.int64), axis=1)
        with gb.scope("dense"):
            w = gb.initializer(gb.normal((cfg.hidden, cfg.hidden), std), "weight")
            b = gb.initializer(gb.normal((cfg.hidden,), std), "bias")
            pooled = gb.op("Gemm", cls, w, b, alpha=1.0, beta=1.0, transB=1)
        gb.op("Tanh", pooled, output="pooler_output")

    gb.add_output("last_hidden_state", np.float32, [batch, seq_len, cfg.hidden])
    gb.add_output("pooler_output", np.float32, [batch, cfg.hidden])
    return gb.build("bert_base", "HuggingFace BertModel (base) layout, random weights")
