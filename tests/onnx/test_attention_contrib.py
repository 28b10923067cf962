"""com.microsoft Attention, MultiHeadAttention, RotaryEmbedding, GroupQueryAttention and
ConcatPastPresent on pygraphx `ref` against ONNX Runtime.

Ends with an ONNX Runtime transformer-optimised BERT (Attention, SkipLayerNormalization, Gelu
from com.microsoft) compared with ONNX Runtime's run of the same optimised model.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest

from pygraphx.ir.shape import Shape
from pygraphx.ops.attention import ConcatPastPresent
from pygraphx.ops.base import ShapeError
from tests.helpers import NodeInput, run_ort, run_pgx
from tests.onnx.contrib_check import (
    MS,
    RNG,
    check_ort,
    compare,
    node_model,
    rand,
    rotary_inputs,
)

# --- com.microsoft Attention and MultiHeadAttention -------------------------------------------


BATCH, SEQ, HIDDEN, HEADS = 2, 4, 16, 2
X = rand(BATCH, SEQ, HIDDEN)
WEIGHTS = rand(HIDDEN, 3 * HIDDEN, scale=0.3)
BIAS = rand(3 * HIDDEN)


@pytest.mark.parametrize(
    ("mask", "past", "attrs"),
    [
        (None, False, {}),
        (np.array([3, 4], np.int32), False, {}),
        (np.array([0, 2], np.int32), False, {}),
        (np.array([3, 4, 1, 0], np.int32), False, {}),  # end and start positions
        (np.array([[1, 1, 0, 1], [1, 0, 1, 1]], np.int32), False, {}),
        ((RNG.random((BATCH, SEQ, SEQ)) > 0.3).astype(np.int32), False, {}),
        (None, False, {"unidirectional": 1}),
        (np.array([3, 4], np.int32), False, {"unidirectional": 1}),
        (None, True, {}),
        (
            np.array([[1, 1, 0, 1, 1, 1, 1], [1, 0, 1, 1, 1, 1, 1]], np.int32),
            True,
            {"unidirectional": 1},
        ),
        (None, False, {"scale": 0.1, "mask_filter_value": -1e9}),
    ],
)
def test_ms_attention(mask: np.ndarray | None, past: bool, attrs: dict[str, Any]) -> None:
    past_value = rand(2, BATCH, HEADS, 3, HIDDEN // HEADS) if past else None
    inputs = [
        ("x", X, False),
        ("w", WEIGHTS, True),
        ("b", BIAS, True),
        ("mask", mask, False),
        ("past", past_value, False),
    ]
    outputs = (0, 1) if past else (0,)
    check_ort("Attention", inputs, {"num_heads": HEADS, **attrs}, outputs, domain=MS)


def test_ms_attention_bias_input() -> None:
    inputs = [
        ("x", X, False),
        ("w", WEIGHTS, True),
        ("b", BIAS, True),
        ("mask", None, False),
        ("past", None, False),
        ("attention_bias", rand(1, HEADS, SEQ, SEQ), False),
    ]
    check_ort("Attention", inputs, {"num_heads": HEADS}, domain=MS)


def test_ms_attention_qkv_hidden_sizes() -> None:
    inputs = [("x", X, False), ("w", rand(HIDDEN, 40, scale=0.3), True), ("b", rand(40), True)]
    attrs = {"num_heads": HEADS, "qkv_hidden_sizes": [16, 16, 8]}
    check_ort("Attention", inputs, attrs, domain=MS)


def mha_inputs(
    q: np.ndarray,
    k: np.ndarray | None = None,
    v: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    attention_bias: np.ndarray | None = None,
    past: int = 0,
) -> list[NodeInput]:
    size = HIDDEN // HEADS
    return [
        ("q", q, False),
        ("k", k, False),
        ("v", v, False),
        ("bias", bias, True),
        ("mask", mask, False),
        ("attention_bias", attention_bias, False),
        ("past_key", rand(BATCH, HEADS, past, size) if past else None, False),
        ("past_value", rand(BATCH, HEADS, past, size) if past else None, False),
    ]


KV_LEN = 5


def _cross(**extra: Any) -> dict[str, Any]:
    """Cross-attention tensors: X attends KV_LEN keys."""
    return {"q": X, "k": rand(BATCH, KV_LEN, HIDDEN), "v": rand(BATCH, KV_LEN, HIDDEN), **extra}


def _with_past(**extra: Any) -> dict[str, Any]:
    return {
        "q": X,
        "k": rand(BATCH, SEQ, HIDDEN),
        "v": rand(BATCH, SEQ, HIDDEN),
        "past": 4,
        **extra,
    }


KEY_LENGTHS = np.array([3, 5], np.int32)
MHA_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[int, ...]]] = {
    "self": ({"q": X, "k": X, "v": X}, {}, (0,)),
    "cross_bias": (_cross(bias=BIAS), {}, (0,)),
    "v_hidden": (_cross(v=rand(BATCH, KV_LEN, 8), bias=rand(40)), {}, (0,)),
    "key_lengths": (_cross(mask=KEY_LENGTHS), {}, (0,)),
    "key_padding_2d": (_cross(mask=(RNG.random((BATCH, KV_LEN)) > 0.3).astype(np.int32)), {}, (0,)),
    "mask_3d": (_cross(mask=(RNG.random((BATCH, SEQ, KV_LEN)) > 0.3).astype(np.int32)), {}, (0,)),
    "attention_bias": (_cross(attention_bias=rand(BATCH, 1, SEQ, KV_LEN)), {}, (0,)),
    "unidirectional": ({"q": X, "k": X, "v": X}, {"unidirectional": 1}, (0,)),
    "past": (_with_past(bias=BIAS), {}, (0, 1, 2)),
    "past_causal": (_with_past(), {"unidirectional": 1}, (0, 1, 2)),
    "bnsh_kv": (_cross(k=rand(BATCH, HEADS, KV_LEN, 8), v=rand(BATCH, HEADS, KV_LEN, 8)), {}, (0,)),
    "qk_output": (_cross(mask=KEY_LENGTHS), {"scale": 0.2}, (0, 1, 2, 3)),
}


@pytest.mark.parametrize("case", list(MHA_CASES))
def test_multi_head_attention(case: str) -> None:
    tensors, attrs, outputs = MHA_CASES[case]
    check_ort(
        "MultiHeadAttention", mha_inputs(**tensors), {"num_heads": HEADS, **attrs}, outputs,
        domain=MS,
    )  # fmt: skip


def test_multi_head_attention_packed() -> None:
    # ONNX Runtime's CPU kernel has no packed formats: compare with its unpacked run
    size = HIDDEN // HEADS
    q, k, v = (rand(BATCH, SEQ, HEADS, size) for _ in range(3))
    flat = [t.reshape(BATCH, SEQ, HIDDEN) for t in (q, k, v)]
    attrs = {"num_heads": HEADS}
    model, feeds = node_model("MultiHeadAttention", mha_inputs(*flat, bias=BIAS), attrs, domain=MS)
    expected = run_ort(model, feeds)
    packed_qkv = np.stack([q, k, v], axis=3)
    model, feeds = node_model(
        "MultiHeadAttention", mha_inputs(packed_qkv, bias=BIAS), attrs, domain=MS
    )
    compare(run_pgx(model, feeds), expected)
    packed_kv = np.stack([k, v], axis=3)
    model, feeds = node_model(
        "MultiHeadAttention", mha_inputs(flat[0], packed_kv, bias=BIAS), attrs, domain=MS
    )
    compare(run_pgx(model, feeds), expected)


# --- com.microsoft RotaryEmbedding and GroupQueryAttention ------------------------------------


@pytest.mark.parametrize(
    ("spec", "attrs"),
    [
        ({"rank": 3}, {"num_heads": 2}),
        ({"rank": 3}, {}),  # heads derived from the cache width
        ({"rank": 3}, {"interleaved": 1}),
        ({"rank": 4}, {}),
        ({"rank": 4}, {"interleaved": 1}),
        ({"rank": 3, "positions": "offset"}, {}),
        ({"rank": 3, "positions": "offset", "positions_const": True}, {}),
        ({"rank": 3, "rotary_dim": 4}, {"num_heads": 2, "rotary_embedding_dim": 4}),
        (
            {"rank": 4, "rotary_dim": 4},
            {"num_heads": 2, "rotary_embedding_dim": 4, "interleaved": 1},
        ),
    ],
)
def test_ms_rotary_embedding(spec: dict[str, Any], attrs: dict[str, Any]) -> None:
    check_ort("RotaryEmbedding", rotary_inputs(contrib=True, **spec), attrs, domain=MS)


def gqa_inputs(
    *,
    batch: int = 2,
    seq: int = 3,
    heads: int = 4,
    kv_heads: int = 2,
    size: int = 16,
    past: int = 0,
    seqlens: Sequence[int] | None = None,
    total: int | None = None,
    total_const: bool = True,
    rotary: bool = False,
    packed: bool = False,
) -> list[NodeInput]:
    q = rand(batch, seq, heads * size)
    k, v = rand(batch, seq, kv_heads * size), rand(batch, seq, kv_heads * size)
    if packed:
        q, k, v = np.concatenate([q, k, v], axis=-1), None, None
    seqlens_k = np.asarray(seqlens if seqlens is not None else [seq - 1] * batch, np.int32)
    return [
        ("query", q, False),
        ("key", k, False),
        ("value", v, False),
        ("past_key", rand(batch, kv_heads, past, size) if past else None, False),
        ("past_value", rand(batch, kv_heads, past, size) if past else None, False),
        ("seqlens_k", seqlens_k, False),
        ("total_sequence_length", np.asarray(total or seq, np.int32), total_const),
        ("cos_cache", rand(16, size // 2) if rotary else None, True),
        ("sin_cache", rand(16, size // 2) if rotary else None, True),
    ]


DECODE = {"seq": 1, "past": 8, "seqlens": [5, 3], "total": 6}
GQA_CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "prompt": ({}, {}),
    "prompt_runtime_total": ({"total_const": False}, {}),
    "prompt_mha": ({"kv_heads": 4}, {}),
    "prompt_mqa": ({"kv_heads": 1}, {}),
    "decode_shared_buffer": (DECODE, {}),
    "decode_shared_buffer_runtime_total": ({**DECODE, "total_const": False}, {}),
    "decode_growing_cache": ({"seq": 1, "past": 4, "seqlens": [4, 4], "total": 5}, {}),
    "subsequent_prompt": ({"batch": 1, "seq": 3, "past": 8, "seqlens": [6], "total": 7}, {}),
    "rotary_prompt": ({"rotary": True}, {"do_rotary": 1}),
    "rotary_decode": ({**DECODE, "rotary": True}, {"do_rotary": 1}),
    "rotary_interleaved": ({**DECODE, "rotary": True}, {"do_rotary": 1, "rotary_interleaved": 1}),
    "local_window": ({"seq": 6}, {"local_window_size": 2}),
    "local_window_decode": (
        {"seq": 1, "past": 8, "seqlens": [7, 3], "total": 8},
        {"local_window_size": 3},
    ),
    "softcap": ({}, {"softcap": 1.5}),
    "scale": ({}, {"scale": 0.3}),
    "packed": ({"packed": True}, {}),
    "packed_decode": ({**DECODE, "packed": True}, {}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(GQA_CASES))
def test_group_query_attention(case: str) -> None:
    spec, attrs = GQA_CASES[case]
    heads, kv_heads = 4, spec.get("kv_heads", 2)
    check_ort(
        "GroupQueryAttention", gqa_inputs(**spec),
        {"num_heads": heads, "kv_num_heads": kv_heads, **attrs}, (0, 1, 2), domain=MS,
    )  # fmt: skip


def test_concat_past_present_operator() -> None:
    op = ConcatPastPresent(present_length=4)
    new, past = np.arange(8.0).reshape(2, 1, 2, 2), -np.ones((2, 1, 3, 2))
    out = op.compute(Shape("double_type", [2, 1, 4, 2]), [np.array([1, 3]), new, past])
    np.testing.assert_array_equal(out[0, 0], [[-1, -1], [0, 1], [2, 3], [0, 0]])
    np.testing.assert_array_equal(out[1, 0], [[-1, -1], [-1, -1], [-1, -1], [4, 5]])
    with pytest.raises(ShapeError, match="past_lens"):
        op.compute_shape([Shape("float_type", [2]), Shape("double_type", [2, 1, 2, 2])])


# --- an ONNX Runtime-optimised BERT -----------------------------------------------------------


@pytest.mark.slow
def test_ort_optimized_bert() -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    from pygraphx.models import get_model, model_inputs

    model = get_model("bert_base", seq_len=32)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "bert.onnx")
        onnx.save(model, path)
        optimized = optimize_model(path, model_type="bert", num_heads=12, hidden_size=768).model
    fused = {(n.domain, n.op_type) for n in optimized.graph.node}
    assert {(MS, "Attention"), (MS, "SkipLayerNormalization")} <= fused
    feeds = model_inputs("bert_base", model)
    feeds["attention_mask"][0, 25:] = 0  # right padding: a 1-D mask_index
    ours, ref = run_pgx(optimized, feeds), run_ort(optimized, feeds)
    compare(ours, ref, rtol=1e-4, atol=1e-4)
