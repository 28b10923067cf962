"""The CPU attention and layer-norm steps' short call paths (`onednn_attention.attend`'s flat
signature, `onednn_layernorm.LayerNorm`'s last thread count): one block function called with
operands of other layouts, batches and types, and a norm called at other thread counts, each
result against a float64 oracle; the block writing the merged heads in place of the views
after it (`Block.into`), alone and in programs against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import attention, onednn_attention, onednn_layernorm  # noqa: E402
from pygraphx.targets.torch_lowering.attention import _sdpa  # noqa: E402
from tests.targets.test_cpuattn_onednn_attention import small_model  # noqa: E402

GEN = torch.Generator().manual_seed(10)


def oracle(q, kt, v, mask, scale: float) -> torch.Tensor:
    x = (q.double() @ kt.double()) * scale
    if mask is not None:
        x = x + mask.double()
    return torch.softmax(x, -1) @ v.double()


def fused_views(b: int, h: int, s: int, d: int) -> tuple:
    """Q, K^T, V as head views of one (b, s, 3 * h * d) product (rows with gaps)."""
    qkv = torch.randn(b, s, 3 * h * d, generator=GEN)
    q, k, v = (qkv[..., i * h * d : (i + 1) * h * d].view(b, s, h, d).transpose(1, 2)
               for i in range(3))  # fmt: skip
    return q, k.transpose(-1, -2), v


@pytest.mark.skipif(not onednn_attention.available(), reason="oneDNN's C API library")
def test_one_block_function_follows_layouts_batches_and_types() -> None:
    """Dense operands of batch 1 and 2 have the same strides: the signature's shapes tell
    them apart; so do the types (a bf16 call after float32 ones, same shapes and strides)."""
    scale = 0.125
    table: dict = {}
    calls = []

    def fallback(q, kt, v, mask):
        calls.append(q.dtype)
        return _sdpa(scale, q.dtype)(q, kt, v, mask)

    run = onednn_attention.attend(scale, table, fallback)
    s, h, d = 32, 4, 16
    cases = []
    for b in (2, 1, 2):
        q, kt, v = fused_views(b, h, s, d)
        mask = torch.where(torch.rand(b, 1, 1, s, generator=GEN) < 0.3, -1e4, 0.0)
        cases.append((q, kt, v, mask))
        dense = (q.contiguous(), kt.contiguous(), v.contiguous(), mask)
        cases.append(dense)
    for q, kt, v, mask in cases:
        got = run(q, kt, v, mask)
        torch.testing.assert_close(got.double(), oracle(q, kt, v, mask, scale), rtol=1e-4,
                                   atol=1e-5)  # fmt: skip
    # batch 1 and 2, each strided and dense: four plans, none sent to the fallback
    assert len(table[onednn_attention.PLANS]) == 4 and not calls
    q, kt, v, mask = cases[1]
    low = run(q.bfloat16(), kt.bfloat16(), v.bfloat16(), mask)
    assert low.dtype == torch.bfloat16
    err = (low.double() - oracle(q, kt, v, mask, scale)).abs().max()
    assert float(err) < 5e-2


@pytest.mark.skipif(not onednn_layernorm.wanted(), reason="oneDNN's C API library")
def test_layer_norm_follows_the_thread_count() -> None:
    """The primitive kept for the last call's thread count is swapped when the count
    changes, and the one made before is taken again when it comes back."""
    dims = (3, 8, 48)
    x = torch.randn(dims, generator=GEN) * 2 + 1
    w, b = torch.randn(48, generator=GEN), torch.randn(48, generator=GEN)
    table: dict = {}
    norm = onednn_layernorm.LayerNorm(table, dims, w, b, 1e-5, torch.float32)
    want = torch.nn.functional.layer_norm(x.double(), (48,), w.double(), b.double(), 1e-5)
    before = torch.get_num_threads()
    other = 1 if before > 1 else 2
    try:
        for threads in (before, other, before, other):
            torch.set_num_threads(threads)
            torch.testing.assert_close(norm(x).double(), want, rtol=1e-5, atol=1e-5)
            assert norm.prim is norm.prims[threads] is not None
    finally:
        torch.set_num_threads(before)
    assert len(table) == 2 and set(norm.prims) == {before, other}


@pytest.mark.skipif(not onednn_attention.available(), reason="oneDNN's C API library")
def test_into_writes_the_merged_heads_on_both_paths() -> None:
    """`Block.into` leaves in a dense (b, s, h * d) tensor what the model's transpose and
    reshape make of the block's output: from the primitives, and from the fallback (a
    broadcast operand the primitives do not take)."""
    scale, (b, h, s, d) = 0.25, (2, 3, 16, 8)
    q, kt, v = fused_views(b, h, s, d)
    fell = []

    def fallback(q, kt, v, mask):
        fell.append(1)
        return _sdpa(scale, torch.float32)(q, kt, v, mask)

    block = onednn_attention.attend(scale, {}, fallback)
    assert isinstance(block, onednn_attention.Block)
    heads_merged = [lambda t: t.transpose(1, 2), lambda t: t.reshape(b, s, h * d)]
    shape = onednn_attention.merged((b, h, s, d), torch.float32, heads_merged)
    assert shape == (b, s, h * d)
    broadcast_k = kt[:1].expand(b, h, d, s)
    for operands, fallen in (((q, kt, v), 0), ((q, broadcast_k, v), 1)):
        out = torch.full(shape, float("nan"))
        block.into(*operands, None, out)
        want = oracle(*operands, None, scale).transpose(1, 2).reshape(b, s, h * d)
        torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
        assert len(fell) == fallen
    # views that do not give a dense tensor over the output's memory: not merged
    assert onednn_attention.merged((b, h, s, d), torch.float32, [lambda t: t[:, :2]]) is None


@pytest.mark.skipif(not onednn_attention.available(), reason="oneDNN's C API library")
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_program_blocks_write_merged_heads(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a float32 BERT / GPT-2 each block writes its merged heads through `Block.into` (no
    step of the head views), and the outputs match ONNX Runtime."""
    ort = pytest.importorskip("onnxruntime")
    monkeypatch.setattr(attention, "ONEDNN_F32_MIN", 1024)  # the small model's blocks
    calls = []
    into = onednn_attention.Block.into

    def counted(self, *args):
        calls.append(1)
        return into(self, *args)

    monkeypatch.setattr(onednn_attention.Block, "into", counted)
    model, feeds = small_model(name)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget())
    for _ in range(2):
        got = prog.run(feeds)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    assert len(calls) == 2 * 2  # two layers, two runs
