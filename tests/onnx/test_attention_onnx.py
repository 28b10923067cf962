"""ONNX Attention, RotaryEmbedding, Swish, SwiGLU and LinearAttention on pygraphx `ref` against
ONNX Runtime (or the ONNX reference evaluator where ONNX Runtime has no kernel: SwiGLU,
LinearAttention, Attention-25 windows, short attention masks). The com.microsoft ops are in
test_attention_contrib.py, test_contrib_norms.py and test_matmul_nbits.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from tests.helpers import NodeInput, run_pgx
from tests.onnx.contrib_check import (
    RNG,
    check_ort,
    compare,
    node_model,
    rand,
    rotary_inputs,
    run_reference,
)

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
