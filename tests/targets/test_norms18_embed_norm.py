"""An encoder's embeddings summed and normalised as one native step (`torch_lowering/
embed_norm.py`, `layernorm.c`'s `ln_embed_f32`, helper norms18): the kernel against float64
numpy (negative ids, odd widths, 1 and 2 threads, an id out of range raising); programs (BERT's
word + position + type embeddings and norm, MiniLM's word + position) against ONNX Runtime,
batch 1 and 3, 1 and 2 threads; the step must have been taken (or not, where the pattern does
not hold); `PGX_CPU_EMBED_NORM=0` keeps the old steps."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.runtime.evaluator import EvaluationError  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import embed_norm, native_layernorm  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(1819)


def _native_or_skip() -> None:
    try:
        native_layernorm.library()
    except native.NativeUnavailable as exc:
        pytest.skip(str(exc))


def _ln(e, w, b, eps):
    mu = e.mean(-1, keepdims=True)
    var = ((e - mu) ** 2).mean(-1, keepdims=True)
    return (e - mu) / np.sqrt(var + eps) * w + b


@pytest.mark.parametrize("dims", [(1, 7, 45), (3, 33, 83), (8, 128, 384), (2, 5, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_against_float64(dims, threads) -> None:
    _native_or_skip()
    B, T, N = dims
    V, S = 50, 3
    word = RNG.standard_normal((V, N)).astype(np.float32)
    kind = RNG.standard_normal((S, N)).astype(np.float32)
    pos = RNG.standard_normal((T, N)).astype(np.float32)
    ids = RNG.integers(-V, V, (B, T))  # negative ids count from the end
    tids = RNG.integers(0, S, (B, T))
    w = (1 + RNG.standard_normal(N) / 4).astype(np.float32)
    b = RNG.standard_normal(N).astype(np.float32)
    out = torch.full(dims, float("nan"))
    parts = [(True, torch.from_numpy(word)), (False, torch.from_numpy(pos)),
             (True, torch.from_numpy(kind))]  # fmt: skip
    embed = embed_norm.Embed(dims, parts, torch.from_numpy(w), torch.from_numpy(b), 1e-12, out)
    want = _ln(word[np.where(ids < 0, ids + V, ids)].astype(np.float64) + pos + kind[tids],
               w, b, 1e-12)  # fmt: skip
    for _ in range(2):
        got = embed([torch.from_numpy(ids), torch.from_numpy(tids)], threads)
        assert got.data_ptr() == out.data_ptr()
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=2e-5)
    bad = ids.copy()
    bad[-1, -1] = V  # out of range
    with pytest.raises(IndexError):
        embed([torch.from_numpy(bad), torch.from_numpy(tids)], threads)
    with pytest.raises(RuntimeError, match="not as lowered"):
        embed([torch.from_numpy(ids).int(), torch.from_numpy(tids)], threads)


V, S, D = 61, 2, 45  # D not a multiple of 16


def embeddings(batch: int, tokens: int, kind: str) -> tuple:
    """`kind="bert"`: LN(word[ids] + pos + type[tids]) then a product; `"minilm"`: LN(word[ids]
    + pos) (no type ids); `"shared"`: the sum also read by another node (no fused step)."""
    ids = RNG.integers(0, V, (batch, tokens)).astype(np.int64)
    tids = RNG.integers(0, S, (batch, tokens)).astype(np.int64)
    inits = {
        "word": RNG.standard_normal((V, D)).astype(np.float32),
        "pos": RNG.standard_normal((1, tokens, D)).astype(np.float32),
        "type": RNG.standard_normal((S, D)).astype(np.float32),
        "g": (1 + RNG.standard_normal(D) / 4).astype(np.float32),
        "be": RNG.standard_normal(D).astype(np.float32),
        "w": (RNG.standard_normal((D, D)) / 6).astype(np.float32),
    }
    nodes = [
        helper.make_node("Gather", ["word", "ids"], ["we"], axis=0),
        helper.make_node("Add", ["we", "pos"], ["e1"]),
    ]
    feeds = {"ids": ids}
    last = "e1"
    if kind in ("bert", "shared"):
        nodes += [helper.make_node("Gather", ["type", "tids"], ["te"], axis=0),
                  helper.make_node("Add", ["e1", "te"], ["e2"])]  # fmt: skip
        feeds["tids"] = tids
        last = "e2"
    nodes += [
        helper.make_node("LayerNormalization", [last, "g", "be"], ["y"], axis=-1,
                         epsilon=1e-12),  # fmt: skip
        helper.make_node("MatMul", ["y", "w"], ["m"]),
        helper.make_node("Add", ["m", "y"], ["out"]),
    ]
    outputs = ["out"]
    if kind == "shared":
        nodes.append(helper.make_node("Mul", [last, last], ["sq"]))
        outputs.append("sq")
    return make_model(nodes, feeds, outputs, inits, opset=18), feeds


def _run(model, feeds, threads: int) -> int:
    """The program against ORT over three runs (other ids between); the number of fused
    embedding + norm steps its lowering made."""
    data = model.SerializeToString()
    sess = ort.InferenceSession(data)
    prog = pygraphx.parse_onnx_buffer(data)
    prog.compile(CpuTarget(threads=threads))
    other = {k: np.ascontiguousarray(v[:, ::-1]) for k, v in feeds.items()}
    for feed in (feeds, other, feeds):
        want = sess.run(None, feed)
        got = prog.run(feed)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-5)
    return prog._executable.lowered.ctx.cache.get(embed_norm.BLOCKS, 0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", ["bert", "minilm"])
def test_embeddings_against_ort(batch, threads, kind) -> None:
    _native_or_skip()
    assert _run(*embeddings(batch, 19, kind), threads) == 1


def test_sum_read_elsewhere_keeps_its_steps() -> None:
    _native_or_skip()
    assert _run(*embeddings(3, 19, "shared"), 2) == 0


def test_switch_keeps_old_steps(monkeypatch) -> None:
    _native_or_skip()
    monkeypatch.setenv(embed_norm.ENV, "0")
    assert _run(*embeddings(3, 19, "bert"), 2) == 0


@pytest.mark.parametrize("switch", ["1", "0"])
def test_id_out_of_range_raises(monkeypatch, switch) -> None:
    """As the gather step says it: the error names the gather, the input and the range."""
    _native_or_skip()
    monkeypatch.setenv(embed_norm.ENV, switch)
    model, feeds = embeddings(1, 19, "bert")
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    assert prog._executable.lowered.ctx.cache.get(embed_norm.BLOCKS, 0) == int(switch)
    bad = dict(feeds)
    bad["ids"] = feeds["ids"].copy()
    bad["ids"][0, 3] = V + 5
    with pytest.raises(EvaluationError, match="input 'ids' holds 66, out of range for a "
                                              "dimension of 61"):  # fmt: skip
        prog.run(bad)
