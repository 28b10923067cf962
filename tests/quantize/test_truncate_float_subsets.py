"""quantize_bf16 / quantize_fp16 restricted to a few operators (`ins_names`), against ONNX Runtime.

Regression for NaN outputs: with `("mul",)` selected but not `multibroadcast`, BERT's extended
attention mask `(1 - m) * finfo(float32).min` multiplied a runtime `convert` of the broadcast
constant, which rounded float32's lowest value to -inf in bf16 (and half), so the unmasked
positions computed `0 * -inf = NaN` and every output was NaN. A view of a literal now takes the
same view of the literal's saturated low-precision copy.

Each case runs on `ref` and `cpu` and compares with ONNX Runtime in float32 within a bf16 / half
tolerance (relative RMS error).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import pygraphx
from pygraphx.models.bert import BertConfig, build_bert
from pygraphx.quantize import quantize_bf16, quantize_fp16
from tests.helpers import make_model
from tests.quantize.test_truncate_float import rel_rms

QUANTIZE = {"bf16": quantize_bf16, "fp16": quantize_fp16}
#: relative RMS error allowed against float32 (bf16 keeps 8 mantissa bits, half 11)
TOLERANCE = {"bf16": 2e-2, "fp16": 4e-3}
#: the subsets of the bug report, each operator alone that matters here, and the defaults
SUBSETS = [
    ("dot", "add", "mul", "erf", "div", "pow", "tanh"),
    ("mul",),
    ("add",),
    ("dot",),
    ("dot", "mul"),
    ("all",),
    ("products",),
]
TINY_BERT = BertConfig(hidden=64, layers=1, heads=2, intermediate=128, vocab_size=100)


def check_against_ort(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], low: str, ops: tuple, target: str
) -> None:
    """Quantize `model` to `low` for `ops`, run it on `target`, compare with ORT float32."""
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    QUANTIZE[low](prog, ops)
    prog.compile(pygraphx.get_target(target))
    got = [np.array(r) for r in prog.run({k: pygraphx.argument(v) for k, v in feeds.items()})]
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape
        bad = int(np.sum(~np.isfinite(g)))
        assert bad == 0, f"{low} {ops} on {target}: output {k} has {bad}/{g.size} non-finite"
        err = rel_rms(g, w)
        assert err < TOLERANCE[low], f"{low} {ops} on {target}: output {k} rel RMS {err:.2e}"


def tiny_bert_feeds(pad: int) -> dict[str, np.ndarray]:
    """Inputs for the [1, 8] tiny BERT, the last `pad` positions masked out."""
    rng = np.random.default_rng(1)
    mask = np.ones((1, 8), np.int64)
    mask[:, 8 - pad :] = 0
    return {
        "input_ids": rng.integers(0, TINY_BERT.vocab_size, (1, 8)).astype(np.int64),
        "attention_mask": mask,
        "token_type_ids": rng.integers(0, 2, (1, 8)).astype(np.int64),
    }


@pytest.mark.parametrize("target", ["ref", "cpu"])
@pytest.mark.parametrize("low", ["bf16", "fp16"])
@pytest.mark.parametrize("ops", SUBSETS, ids="-".join)
def test_tiny_bert_op_subsets(ops: tuple, low: str, target: str) -> None:
    """One BERT layer (layernorm, attention with the finfo.min mask, GELU, tanh pooler)."""
    model = build_bert(batch=1, seq_len=8, seed=0, config=TINY_BERT)
    check_against_ort(model, tiny_bert_feeds(pad=3), low, ops, target)


def mask_softmax_model() -> onnx.ModelProto:
    """The smallest reproducer: scores + Mul(Sub(1, Cast(mask)), finfo.min) -> Softmax."""
    big = np.array(np.finfo(np.float32).min, np.float32)
    nodes = [
        helper.make_node("Unsqueeze", ["mask", "axes"], ["m4"]),
        helper.make_node("Cast", ["m4"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "mf"], ["inv"]),
        helper.make_node("Mul", ["inv", "big"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["y"], axis=-1),
    ]
    example = {
        "scores": np.zeros((2, 4, 6), np.float32),
        "mask": np.zeros((2, 6), np.int64),
    }
    inits = {"axes": np.array([1], np.int64), "one": np.array(1.0, np.float32), "big": big}
    return make_model(nodes, example, ["y"], inits)


@pytest.mark.parametrize("target", ["ref", "cpu"])
@pytest.mark.parametrize("low", ["bf16", "fp16"])
@pytest.mark.parametrize("ops", [("mul",), ("mul", "add"), ("all",)], ids="-".join)
def test_mask_softmax_op_subsets(ops: tuple, low: str, target: str) -> None:
    rng = np.random.default_rng(2)
    mask = np.ones((2, 6), np.int64)
    mask[0, 4:] = 0
    feeds = {"scores": rng.standard_normal((2, 4, 6)).astype(np.float32), "mask": mask}
    check_against_ort(mask_softmax_model(), feeds, low, ops, target)
