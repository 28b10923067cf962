"""ONNX Attention, RotaryEmbedding, Swish, SwiGLU and LinearAttention, and the com.microsoft
contrib ops, on pygraphx `ref` against ONNX Runtime (or the ONNX reference evaluator where ONNX
Runtime has no kernel: SwiGLU, LinearAttention, Attention-25 windows, short attention masks;
numpy for BiasAdd).

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
from tests import helpers
from tests.helpers import NodeInput, run_ort, run_pgx

MS = "com.microsoft"
# (name, value or None for an omitted input, is an initializer)
RNG = np.random.default_rng(0)


def rand(*lens: int, dtype: type = np.float32, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(lens) * scale).astype(dtype)


def node_model(
    op_type: str,
    inputs: Sequence[NodeInput],
    attrs: dict[str, Any] | None = None,
    outputs: Sequence[int] = (0,),
    *,
    opset: int = 23,
    domain: str = "",
    out_types: dict[int, type] | None = None,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model importing both the default and the com.microsoft domain, outputs
    typed (ONNX Runtime wants a type for every graph output)."""
    return helpers.node_model(
        op_type, inputs, attrs, outputs, opset=opset, domain=domain,
        extra_opsets=((MS, 1),), typed=True, out_types=out_types,
    )  # fmt: skip


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]


def compare(
    ours: Sequence[np.ndarray],
    ref: Sequence[np.ndarray],
    rtol: float = 1e-5,
    atol: float = 1e-6,
    masked_floor: bool = False,
) -> None:
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref, strict=True)):
        b = np.asarray(b)
        assert a.dtype == b.dtype, f"output {k}: dtype {a.dtype}, expected {b.dtype}"
        assert a.shape == b.shape, f"output {k}: shape {a.shape}, expected {b.shape}"
        if masked_floor:  # ONNX Runtime masks with the lowest float, the ONNX spec with -inf
            lowest = np.finfo(a.dtype).min
            a, b = np.maximum(a, lowest), np.maximum(b, lowest)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}")


def check_ort(
    op_type: str,
    inputs: Sequence[NodeInput],
    attrs: dict[str, Any] | None = None,
    outputs: Sequence[int] = (0,),
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    **kw: Any,
) -> list[np.ndarray]:
    masked_floor = kw.pop("masked_floor", False)
    model, feeds = node_model(op_type, inputs, attrs, outputs, **kw)
    ours = run_pgx(model, feeds)
    compare(ours, run_ort(model, feeds), rtol, atol, masked_floor)
    return ours


# --- ONNX Attention ---------------------------------------------------------------------------


def attention_inputs(
    *,
    batch: int = 2,
    q_heads: int = 4,
    kv_heads: int = 4,
    q_len: int = 3,
    kv_len: int = 5,
    head: int = 8,
    v_head: int | None = None,
    rank: int = 4,
    past: int = 0,
    mask: np.ndarray | None = None,
    mask_const: bool = False,
    nonpad: Sequence[int] | None = None,
    dtype: type = np.float32,
) -> tuple[list[NodeInput], dict[str, Any]]:
    v_head = v_head or head
    attrs: dict[str, Any] = {}
    if rank == 4:
        q = rand(batch, q_heads, q_len, head, dtype=dtype)
        k = rand(batch, kv_heads, kv_len, head, dtype=dtype)
        v = rand(batch, kv_heads, kv_len, v_head, dtype=dtype)
    else:
        q = rand(batch, q_len, q_heads * head, dtype=dtype)
        k = rand(batch, kv_len, kv_heads * head, dtype=dtype)
        v = rand(batch, kv_len, kv_heads * v_head, dtype=dtype)
        attrs = {"q_num_heads": q_heads, "kv_num_heads": kv_heads}
    past_k = rand(batch, kv_heads, past, head, dtype=dtype) if past else None
    past_v = rand(batch, kv_heads, past, v_head, dtype=dtype) if past else None
    inputs: list[NodeInput] = [
        ("Q", q, False),
        ("K", k, False),
        ("V", v, False),
        ("attn_mask", mask, mask_const),
        ("past_key", past_k, False),
        ("past_value", past_v, False),
    ]
    if nonpad is not None:
        inputs.append(("nonpad_kv_seqlen", np.asarray(nonpad, dtype=np.int64), False))
    return inputs, attrs


ATTENTION_CASES: dict[str, dict[str, Any]] = {
    "4d": {},
    "3d": {"rank": 3},
    "gqa": {"kv_heads": 2},
    "mqa_3d": {"kv_heads": 1, "rank": 3},
    "v_head_size": {"v_head": 6},
    "scaled": {"attrs": {"scale": 0.3}},
    "causal": {"attrs": {"is_causal": 1}},
    "causal_square": {"kv_len": 3, "attrs": {"is_causal": 1}},
    "causal_past": {"past": 2, "outputs": (0, 1, 2), "attrs": {"is_causal": 1}},
    "past_3d_all_outputs": {"past": 3, "rank": 3, "outputs": (0, 1, 2, 3)},
    "softcap": {"outputs": (0, 3), "attrs": {"softcap": 2.0}},
    "softcap_mode1": {"outputs": (0, 3), "attrs": {"softcap": 2.0, "qk_matmul_output_mode": 1}},
    "mode2_causal": {
        "outputs": (0, 3),
        "attrs": {"qk_matmul_output_mode": 2, "is_causal": 1},
        "masked_floor": True,
    },
    "mode3": {"outputs": (0, 3), "attrs": {"qk_matmul_output_mode": 3}},
    "float_mask_2d": {"mask": rand(3, 5)},
    "float_mask_4d": {"mask": rand(2, 1, 3, 5)},
    "float_mask_3d_causal": {"mask": rand(4, 3, 5), "attrs": {"is_causal": 1}},
    "bool_mask": {"mask": RNG.random((3, 5)) > 0.3},
    "bool_mask_4d_causal": {"mask": RNG.random((2, 4, 3, 5)) > 0.3, "attrs": {"is_causal": 1}},
    "bool_mask_constant": {"mask": RNG.random((3, 5)) > 0.3, "mask_const": True},
    "fully_masked_row": {
        "mask": np.array([[True, False, True, True, True], [False] * 5, [True] * 5]),
        "outputs": (0, 3),
        "attrs": {"qk_matmul_output_mode": 3},
    },
    "nonpad": {"opset": 24, "nonpad": [3, 5]},
    "nonpad_causal": {"opset": 24, "nonpad": [5, 2], "attrs": {"is_causal": 1}},
    "nonpad_causal_mask": {
        "opset": 24,
        "nonpad": [4, 5],
        "mask": RNG.random((3, 5)) > 0.3,
        "attrs": {"is_causal": 1},
    },
    "softmax_precision": {"attrs": {"softmax_precision": 1}},
    "double": {"dtype": np.float64},
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention(case: str) -> None:
    spec = dict(ATTENTION_CASES[case])
    attrs = spec.pop("attrs", {})
    outputs = spec.pop("outputs", (0,))
    opset = spec.pop("opset", 23)
    masked_floor = spec.pop("masked_floor", False)
    inputs, head_attrs = attention_inputs(**spec)
    check_ort(
        "Attention",
        inputs,
        {**head_attrs, **attrs},
        outputs,
        opset=opset,
        masked_floor=masked_floor,
    )


@pytest.mark.parametrize("rank", [3, 4])
def test_attention_fp16(rank: int) -> None:
    inputs, attrs = attention_inputs(rank=rank, kv_heads=2, dtype=np.float16)
    check_ort("Attention", inputs, {**attrs, "is_causal": 1}, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize(
    ("spec", "attrs"),
    [
        ({"mask": rand(3, 3)}, {}),  # a mask shorter than the keys is padded with -inf
        ({"mask": RNG.random((3, 4)) > 0.2}, {"is_causal": 1}),
        ({}, {"left_window_size": 1, "right_window_size": 0}),
        ({"past": 2}, {"left_window_size": 2, "right_window_size": 1}),
        ({"nonpad": [4, 2]}, {"left_window_size": 1, "is_causal": 1}),
    ],
)
def test_attention_against_reference(spec: dict[str, Any], attrs: dict[str, Any]) -> None:
    # ONNX Runtime rejects short masks and has no opset-25 windows: use the ONNX reference
    inputs, head_attrs = attention_inputs(**spec)
    model, feeds = node_model("Attention", inputs, {**head_attrs, **attrs}, (0,), opset=25)
    compare(run_pgx(model, feeds), run_reference(model, feeds), rtol=1e-5, atol=1e-6)


# --- RotaryEmbedding, Swish, SwiGLU -----------------------------------------------------------


def rotary_inputs(
    *,
    batch: int = 2,
    seq: int = 3,
    heads: int = 2,
    size: int = 8,
    rank: int = 4,
    positions: str | None = "2d",
    positions_const: bool = False,
    max_pos: int = 10,
    rotary_dim: int = 0,
    contrib: bool = False,
    dtype: type = np.float32,
) -> list[NodeInput]:
    x = rand(batch, heads, seq, size, dtype=dtype) if rank == 4 else rand(batch, seq, heads * size)
    half = (rotary_dim or size) // 2
    if positions is None:
        cos, sin, pos = (
            rand(batch, seq, half, dtype=dtype),
            rand(batch, seq, half, dtype=dtype),
            None,
        )
    else:
        cos, sin = rand(max_pos, half, dtype=dtype), rand(max_pos, half, dtype=dtype)
        if positions == "2d":
            pos = RNG.integers(0, max_pos - seq, (batch, seq)).astype(np.int64)
        else:
            pos = np.array([max_pos - seq - 1], dtype=np.int64)
    if contrib:
        return [
            ("x", x, False),
            ("pos", pos, positions_const),
            ("cos", cos, True),
            ("sin", sin, True),
        ]
    return [("x", x, False), ("cos", cos, True), ("sin", sin, True), ("pos", pos, positions_const)]


@pytest.mark.parametrize(
    ("spec", "attrs"),
    [
        ({}, {}),
        ({"rank": 3}, {"num_heads": 2}),
        ({}, {"interleaved": 1}),
        ({"rotary_dim": 4}, {"rotary_embedding_dim": 4}),
        (
            {"rank": 3, "rotary_dim": 4},
            {"rotary_embedding_dim": 4, "interleaved": 1, "num_heads": 2},
        ),
        ({"positions": None}, {}),
        ({"positions": None, "rotary_dim": 6}, {"rotary_embedding_dim": 6, "interleaved": 1}),
        ({"positions_const": True}, {}),
    ],
)
def test_rotary_embedding(spec: dict[str, Any], attrs: dict[str, Any]) -> None:
    check_ort("RotaryEmbedding", rotary_inputs(**spec), attrs)


def test_rotary_embedding_fp16() -> None:
    check_ort("RotaryEmbedding", rotary_inputs(dtype=np.float16), {}, rtol=2e-3, atol=4e-3)


@pytest.mark.parametrize("alpha", [None, 0.7])
def test_swish(alpha: float | None) -> None:
    attrs = {} if alpha is None else {"alpha": alpha}
    check_ort("Swish", [("x", rand(2, 3, 5), False)], attrs, opset=24)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("alpha", [None, 1.5])
def test_swiglu(alpha: float | None, dtype: type) -> None:
    attrs = {} if alpha is None else {"alpha": alpha}
    inputs = [("a", rand(2, 3, 6, dtype=dtype), False), ("b", rand(2, 3, 6, dtype=dtype), False)]
    model, feeds = node_model("SwiGLU", inputs, attrs, opset=28)
    tol = 1e-3 if dtype == np.float16 else 1e-6
    compare(run_pgx(model, feeds), run_reference(model, feeds), rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("rule", "q_heads", "kv_heads", "past", "decay_per_dim", "beta_width", "scale"),
    [
        ("linear", 2, 2, False, False, 0, 0.0),
        ("gated", 2, 2, True, False, 0, 0.0),
        ("gated", 4, 2, False, True, 0, 0.5),
        ("delta", 2, 2, True, False, 2, 0.0),
        ("gated_delta", 4, 2, True, True, 2, 0.0),
        ("gated_delta", 4, 1, False, False, 1, 0.0),
    ],
)
def test_linear_attention(
    rule: str,
    q_heads: int,
    kv_heads: int,
    past: bool,
    decay_per_dim: bool,
    beta_width: int,
    scale: float,
) -> None:
    # opset 27: ONNX Runtime has no kernel yet, so the ONNX reference is the oracle
    batch, seq, dk, dv = 2, 4, 4, 3
    decay = None
    if rule in ("gated", "gated_delta"):
        decay = -RNG.random((batch, seq, kv_heads * (dk if decay_per_dim else 1)))
    beta = RNG.random((batch, seq, beta_width)) if beta_width else None
    inputs = [
        ("query", rand(batch, seq, q_heads * dk, scale=0.5), False),
        ("key", rand(batch, seq, kv_heads * dk, scale=0.5), False),
        ("value", rand(batch, seq, kv_heads * dv), False),
        ("past_state", rand(batch, kv_heads, dk, dv) if past else None, False),
        ("decay", None if decay is None else decay.astype(np.float32), False),
        ("beta", None if beta is None else beta.astype(np.float32), False),
    ]
    attrs = {"update_rule": rule, "q_num_heads": q_heads, "kv_num_heads": kv_heads}
    if scale:
        attrs["scale"] = scale
    model, feeds = node_model("LinearAttention", inputs, attrs, (0, 1), opset=27)
    compare(run_pgx(model, feeds), run_reference(model, feeds), rtol=1e-5, atol=1e-5)


# --- com.microsoft activations and normalisations ---------------------------------------------


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "outputs"),
    [
        ("Gelu", [("x", rand(2, 3, 8), False)], {}, (0,)),
        ("BiasGelu", [("x", rand(2, 3, 8), False), ("b", rand(8), True)], {}, (0,)),
        ("FastGelu", [("x", rand(2, 3, 8), False)], {}, (0,)),
        ("FastGelu", [("x", rand(2, 3, 8), False), ("b", rand(8), True)], {}, (0,)),
        ("QuickGelu", [("x", rand(2, 3, 8), False)], {}, (0,)),
        ("QuickGelu", [("x", rand(2, 3, 8), False)], {"alpha": 1.3}, (0,)),
        (
            "SkipLayerNormalization",
            [
                ("x", rand(2, 3, 8), False),
                ("skip", rand(2, 3, 8), False),
                ("gamma", rand(8), True),
                ("beta", rand(8), True),
                ("bias", rand(8), True),
            ],
            {"epsilon": 1e-5},
            (0, 3),
        ),
        (
            "SkipLayerNormalization",
            [
                ("x", rand(2, 3, 8), False),
                ("skip", rand(3, 8), False),
                ("gamma", rand(8), True),
                ("beta", rand(8), True),
            ],
            {},
            (0, 1, 2, 3),
        ),
        (
            "SkipSimplifiedLayerNormalization",
            [
                ("x", rand(2, 3, 8), False),
                ("skip", rand(2, 3, 8), False),
                ("gamma", rand(8), True),
                ("bias", rand(8), True),
            ],
            {"epsilon": 1e-5},
            (0, 1, 2, 3),
        ),
    ],
)
def test_contrib_elementwise_and_norms(
    op: str, inputs: list[NodeInput], attrs: dict[str, Any], outputs: tuple[int, ...]
) -> None:
    check_ort(op, inputs, attrs, outputs, domain=MS)


@pytest.mark.parametrize(
    ("scale_lens", "attrs"), [((8,), {}), ((3, 8), {"axis": 1, "epsilon": 1e-3})]
)
def test_simplified_layer_normalization(scale_lens: tuple[int, ...], attrs: dict[str, Any]) -> None:
    # registered by ONNX Runtime in the default domain
    inputs = [("x", rand(2, 3, 8), False), ("scale", rand(*scale_lens), True)]
    check_ort("SimplifiedLayerNormalization", inputs, attrs, (0, 1), opset=17)


def test_layer_normalization_before_opset_17() -> None:
    inputs = [("x", rand(2, 3, 8), False), ("scale", rand(8), True), ("b", rand(8), True)]
    check_ort("LayerNormalization", inputs, {"epsilon": 1e-5}, opset=13)


def test_bias_add() -> None:
    # ONNX Runtime implements BiasAdd for CUDA only
    x, bias, skip = rand(2, 4, 8), rand(8), rand(2, 4, 8)
    model, feeds = node_model(
        "BiasAdd", [("x", x, False), ("b", bias, True), ("s", skip, False)], domain=MS
    )
    np.testing.assert_allclose(run_pgx(model, feeds)[0], x + bias + skip, rtol=1e-6)


@pytest.mark.parametrize(
    ("segments", "mask", "positions"),
    [(True, True, False), (True, False, False), (False, True, True)],
)
def test_embed_layer_normalization(segments: bool, mask: bool, positions: bool) -> None:
    batch, seq, hidden = 2, 5, 8
    ids = RNG.integers(0, 20, (batch, seq)).astype(np.int32)
    seg = RNG.integers(0, 2, (batch, seq)).astype(np.int32) if segments else None
    mask_value = np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]], np.int32) if mask else None
    pos = RNG.integers(0, 8, (batch, seq)).astype(np.int32) if positions else None
    inputs = [
        ("ids", ids, False),
        ("seg", seg, False),
        ("words", rand(20, hidden), True),
        ("pos_table", rand(8, hidden), True),
        ("seg_table", rand(2, hidden) if segments else None, True),
        ("gamma", rand(hidden), True),
        ("beta", rand(hidden), True),
        ("mask", mask_value, False),
        ("positions", pos, False),
    ]
    outputs = (0, 1, 2)
    check_ort(
        "EmbedLayerNormalization", inputs, {"epsilon": 1e-5}, outputs, domain=MS,
        out_types={0: np.float32, 1: np.int32, 2: np.float32},
    )  # fmt: skip


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


# --- MatMulNBits ------------------------------------------------------------------------------


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """LSB-first bit packing of the last axis of `values` into uint8."""
    stream = ((values[..., None] >> np.arange(bits)) & 1).astype(np.uint8)
    return np.packbits(stream.reshape(*values.shape[:-1], -1), axis=-1, bitorder="little")


@pytest.mark.parametrize(
    ("k", "n", "bits", "block", "zero_points", "bias", "a_lens"),
    [
        (40, 6, 4, 16, "packed", False, (2, 3)),
        (40, 6, 4, 16, None, False, (2, 3)),
        (40, 6, 4, 16, "float", True, (2, 3)),
        (32, 6, 4, 32, "packed", False, (5,)),
        (64, 7, 4, 16, "packed", True, (1, 2, 64)[:2]),
        (40, 6, 8, 16, "packed", False, (2, 3)),
        (40, 6, 8, 16, None, True, (2, 3)),
        (40, 6, 2, 16, "packed", False, (2, 3)),
        (40, 6, 4, 16, "flat_scales", False, (2, 3)),
    ],
)
def test_matmul_nbits(
    k: int, n: int, bits: int, block: int, zero_points: str | None, bias: bool, a_lens: tuple
) -> None:
    blocks = -(-k // block)
    quantized = RNG.integers(0, 2**bits, (n, blocks, block))
    scales = (RNG.random((n, blocks)) * 0.1 + 0.01).astype(np.float32)
    zp: np.ndarray | None = None
    if zero_points in ("packed", "flat_scales"):
        zp = pack_bits(RNG.integers(0, 2**bits, (n, blocks)), bits)
    elif zero_points == "float":
        zp = (RNG.random((n, blocks)) * 2**bits).astype(np.float32)
    inputs = [
        ("a", rand(*a_lens, k), False),
        ("b", pack_bits(quantized, bits), True),
        ("scales", scales.reshape(-1) if zero_points == "flat_scales" else scales, True),
        ("zero_points", zp, True),
        ("g_idx", None, True),
        ("bias", rand(n) if bias else None, True),
    ]
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block}
    check_ort("MatMulNBits", inputs, attrs, domain=MS, rtol=1e-5, atol=2e-5)


def test_matmul_nbits_needs_constant_weights() -> None:
    inputs = [
        ("a", rand(2, 32), False),
        ("b", pack_bits(RNG.integers(0, 16, (4, 1, 32)), 4), False),
        ("scales", rand(4, 1), True),
    ]
    model, feeds = node_model("MatMulNBits", inputs, {"K": 32, "N": 4, "block_size": 32}, domain=MS)
    with pytest.raises(Exception, match="must be known at compile time"):
        run_pgx(model, feeds, specialize_on_input_values=False)


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
