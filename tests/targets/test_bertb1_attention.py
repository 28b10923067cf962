"""float32 attention on the CPU through oneDNN's primitives (`attention._on_onednn`): the block
against a float64 oracle for every mask form the lowering passes, and whole float32 programs
(BERT, GPT-2) against ONNX Runtime with the primitives on (the default) and off
(`onednn_attention=False`: torch's fused kernel)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import attention, onednn_attention  # noqa: E402
from tests.targets.test_cpuattn_onednn_attention import (  # noqa: E402
    oracle,
    rel_rms,
    small_model,
)

pytestmark = pytest.mark.skipif(
    not onednn_attention.available(), reason="needs oneDNN's C API library"
)


@pytest.fixture(autouse=True)
def _onednn_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the oneDNN / torch routes: blocks stay off the native kernel that
    runs first (`test_native_attention.py`)."""
    monkeypatch.setenv("PGX_CPU_NATIVE_ATTENTION", "0")


#: relative RMS error of a float32 block against float64
F32_RMS = 1e-5


def qkv_views(b: int, h: int, s: int, d: int, seed: int = 0) -> tuple:
    """Q, K^T and V as the strided head views of one fused (b, s, 3*h*d) float32 product."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, s, 3 * h * d, generator=g)
    q, k, v = (qkv[..., i * h * d : (i + 1) * h * d].view(b, s, h, d).transpose(1, 2)
               for i in range(3))  # fmt: skip
    return q, k.transpose(-1, -2), v


def masks(b: int, h: int, s: int) -> dict:
    """None, a padding mask broadcast over heads and queries (a stride-0 view), a causal (s, s)
    one, a per-head bias that is not dense."""
    g = torch.Generator().manual_seed(2)
    pad = torch.where(torch.rand(b, 1, 1, s, generator=g) < 0.3, -1e4, 0.0)
    return {
        "none": None,
        "padding_view": pad.expand(b, h, s, s),
        "causal": torch.triu(torch.full((s, s), -3.4e38), 1).view(1, 1, s, s),
        "bias_strided": torch.randn(1, h, s, s, generator=g).transpose(-1, -2),
    }


@pytest.mark.parametrize("form", ["none", "padding_view", "causal", "bias_strided"])
@pytest.mark.parametrize("shape", [(1, 4, 32, 16), (3, 2, 20, 8), (1, 12, 128, 32)])
def test_float32_block_matches_float64(form: str, shape: tuple) -> None:
    b, h, s, d = shape
    q, kt, v = qkv_views(b, h, s, d)
    mask = masks(b, h, s)[form]
    scale = d**-0.5
    table: dict = {}
    fallback_calls = []

    def fallback(*args):
        fallback_calls.append(1)
        return attention._sdpa(scale, torch.float32)(*args)

    got = onednn_attention.attend(scale, table, fallback)(q, kt, v, mask)
    assert not fallback_calls, "the primitives ran"
    (plan,) = table[onednn_attention.PLANS].values()
    assert not any(impl.startswith("ref") for impl in plan.prims.impls), plan.prims.impls
    assert got.dtype == torch.float32 and tuple(got.shape) == (b, h, s, d)
    want = oracle(q, kt, v, mask, scale)
    assert rel_rms(got, want) < F32_RMS
    torch_err = rel_rms(attention._sdpa(scale, torch.float32)(q, kt, v, mask), want)
    assert rel_rms(got, want) <= max(4 * torch_err, 1e-6)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_float32_program_attention_runs_on_onednn(
    name: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32 transformer's attention blocks run on the primitives by default (the small
    model's 1,024 scores counted as enough) and on torch's fused kernel with
    `onednn_attention=False`; both match ONNX Runtime to float32 precision."""
    from pygraphx.targets.cpu.threads import LOAD_ADAPT_ENV

    monkeypatch.setenv(LOAD_ADAPT_ENV, "0")  # the asked threads even on a busy machine
    monkeypatch.setattr(attention, "ONEDNN_F32_MIN", 1024)
    model, feeds = small_model(name)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for on in (True, False):
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        prog.compile(CpuTarget(threads=threads, **({} if on else {"onednn_attention": False})))
        exe = prog._executable
        assert exe.attention_blocks == 2
        got = prog.run(feeds)
        table = exe.lowered.ctx.cache.get(attention.ONEDNN_TABLE)
        assert bool(table and table.get(onednn_attention.PLANS)) == on
        if on:
            assert all(p is not None for p in table[onednn_attention.PLANS].values())
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scores", [1024, 1 << 22])
def test_float32_blocks_outside_the_size_range_stay_on_torch(scores: int) -> None:
    """Too few scores (the calls' fixed cost) or too many (no longer cache-resident) keep torch's
    fused kernel: the small model's blocks with the bounds moved around them."""
    model, feeds = small_model("bert")
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    with pytest.MonkeyPatch.context() as mp:
        if scores > 1024:
            mp.setattr(attention, "ONEDNN_F32_MAX", 1000)  # 1,024 scores: above the top
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        prog.compile(CpuTarget(threads=1))
    got = prog.run(feeds)
    assert prog._executable.attention_blocks == 2
    assert not prog._executable.lowered.ctx.cache.get(attention.ONEDNN_TABLE)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_size_rule() -> None:
    """bf16 always, float32 from `ONEDNN_F32_MIN` to `ONEDNN_F32_MAX` scores, CPU only."""
    from types import SimpleNamespace

    cpu, gpu = (
        SimpleNamespace(device=torch.device("cpu")),
        SimpleNamespace(device=torch.device("meta")),
    )
    bert_b1, vit_b8 = 12 * 128 * 128, 8 * 12 * 197 * 197
    assert attention._on_onednn(cpu, torch.float32, bert_b1)
    assert not attention._on_onednn(cpu, torch.float32, vit_b8)
    assert not attention._on_onednn(cpu, torch.float32, 2 * 2 * 16 * 16)
    assert attention._on_onednn(cpu, torch.bfloat16, 2 * 2 * 16 * 16)
    assert attention._on_onednn(cpu, torch.bfloat16, vit_b8)
    assert not attention._on_onednn(gpu, torch.float32, bert_b1)


def test_float32_switch_keeps_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """`PGX_CPU_ONEDNN_ATTENTION_F32=0` keeps float32 blocks on torch's kernel, bf16 on oneDNN."""
    from types import SimpleNamespace

    cpu = SimpleNamespace(device=torch.device("cpu"))
    monkeypatch.setenv(attention.F32_ENV, "0")
    assert not attention._on_onednn(cpu, torch.float32, 12 * 128 * 128)
    assert attention._on_onednn(cpu, torch.bfloat16, 12 * 128 * 128)
