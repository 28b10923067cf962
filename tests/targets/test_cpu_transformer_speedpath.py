"""The cpu target's transformer speed path: the attention mask computed once per run for all the
blocks that read the same mask inputs, at the size of its inputs' broadcast-free views; checked
against numpy (float64) on stacks of attention blocks that share a causal and a padding mask."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(23)
FILL = np.float32(-3.4e38)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _block(nodes: list, i: int, q: str, kind: str) -> str:
    """Attention block i on query `q` (keys and values `k`, `v`); returns its output's name."""
    nodes += [
        helper.make_node("MatMul", [q, "kt"], [f"s{i}"]),
        helper.make_node("Mul", [f"s{i}", "scale"], [f"ss{i}"]),
    ]
    score = f"ss{i}"
    if kind in ("causal", "causal_only", "causal_inverted"):
        keep, on, off = (
            ("anti", FILL, score) if kind == "causal_inverted" else ("causal", score, FILL)
        )
        args = [keep, f"ss{i}", "fill"] if on == score else [keep, "fill", f"ss{i}"]
        nodes.append(helper.make_node("Where", args, [f"sw{i}"]))
        score = f"sw{i}"
    if kind != "causal_only":
        nodes.append(helper.make_node("Add", [score, "mask"], [f"sm{i}"]))
        score = f"sm{i}"
    nodes += [
        helper.make_node("Softmax", [score], [f"p{i}"], axis=-1),
        helper.make_node("MatMul", [f"p{i}", "v"], [f"o{i}"]),
    ]
    return f"o{i}"


def stacked_attention(kind: str, layers: int = 3, b: int = 2, h: int = 3, s: int = 6, e: int = 8):
    """`layers` attention blocks, each on the previous block's output plus q, all reading the same
    masks: `kind` "mask" (padding mask only), "causal" (causal where, then the padding mask),
    "causal_only" (no padding mask), "causal_inverted" (where keeps the score where the mask is
    false); returns the model and its inputs."""
    q, k, v = (RNG.standard_normal((b, h, s, e)).astype(np.float32) for _ in range(3))
    causal = np.tril(np.ones((s, s), bool))
    feeds = {"q": q, "k": k, "v": v}
    if kind != "causal_only":
        feeds["mask"] = padding_mask(b, s)
    inits = {"scale": np.array(1 / np.sqrt(e), np.float32), "fill": np.array(FILL),
             "causal": causal, "anti": ~causal}  # fmt: skip
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    x = "q"
    for i in range(layers):
        if i:
            nodes.append(helper.make_node("Add", [x, "q"], [f"x{i}"]))
            x = f"x{i}"
        x = _block(nodes, i, x, kind)
    return make_model(nodes, feeds, [x], inits), feeds


def padding_mask(b: int, s: int) -> np.ndarray:
    """(b, 1, 1, s): 0 or -1e4, keeping the first key (which the causal mask keeps too)."""
    mask = np.where(RNG.random((b, 1, 1, s)) < 0.3, -1e4, 0.0).astype(np.float32)
    mask[..., 0] = 0.0
    return mask


def reference(kind: str, feeds: dict[str, np.ndarray], layers: int = 3) -> np.ndarray:
    """The float64 numpy result of `stacked_attention(kind, layers)` on `feeds`."""
    q, k, v = (feeds[n].astype(np.float64) for n in "qkv")
    s, e = q.shape[-2], q.shape[-1]
    causal = np.tril(np.ones((s, s), bool))
    scale = np.float64(np.float32(1 / np.sqrt(e)))
    x = q
    for i in range(layers):
        if i:
            x = x + q
        logits = (x @ k.transpose(0, 1, 3, 2)) * scale
        if kind.startswith("causal"):
            logits = np.where(causal, logits, np.float64(FILL))
        if kind != "causal_only":
            logits = logits + feeds["mask"]
        x = softmax(logits) @ v
    return x


def compile_cpu(model, **settings) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(**settings))
    return prog


@pytest.mark.parametrize("kind", ["mask", "causal", "causal_only", "causal_inverted"])
def test_stacked_attention_shares_one_mask_and_matches_numpy(kind: str, monkeypatch) -> None:
    """Every block is fused, the mask's `where` runs once per run (not once per block), and the
    result matches numpy on two runs with different masks (no stale mask kept between runs)."""
    calls = []
    where = torch.where

    def counting_where(*args, **kwargs):
        calls.append(1)
        return where(*args, **kwargs)

    monkeypatch.setattr(torch, "where", counting_where)
    model, feeds = stacked_attention(kind)
    prog = compile_cpu(model)
    assert prog._executable.attention_blocks == 3
    for run in range(2):
        calls.clear()
        got = np.array(prog.run(feeds)[0])
        want = reference(kind, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"run {run}")
        assert len(calls) == (0 if kind == "mask" else 1)
        if "mask" in feeds:
            feeds = {**feeds, "mask": padding_mask(*feeds["mask"].shape[::3])}


def test_shared_mask_matches_the_unfused_program() -> None:
    """The fused stack and the same program with attention recognition off agree."""
    model, feeds = stacked_attention("causal", layers=4, b=3, h=2, s=7, e=4)
    want = reference("causal", feeds, layers=4)
    fused = np.array(compile_cpu(model).run(feeds)[0])
    plain = np.array(compile_cpu(model, attention=False).run(feeds)[0])
    np.testing.assert_allclose(fused, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-5)


def test_profiled_run_of_a_stack_matches_numpy() -> None:
    """A profiled run (observer: every instruction in module order) gives the same result."""
    model, feeds = stacked_attention("causal")
    want = reference("causal", feeds)
    prog = compile_cpu(model)
    seen: list[str] = []
    got = prog.run(feeds, observer=lambda ins, value, seconds: seen.append(ins.op.name))
    np.testing.assert_allclose(np.array(got[0]), want, rtol=1e-5, atol=1e-5)
    assert seen.count("dot") == 6
