"""The CPU attention and layer-norm steps' short call paths (`onednn_attention.attend`'s flat
signature, `onednn_layernorm.LayerNorm`'s last thread count): one block function called with
operands of other layouts, batches and types, and a norm called at other thread counts, each
result against a float64 oracle."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pygraphx.targets.torch_lowering import onednn_attention, onednn_layernorm  # noqa: E402
from pygraphx.targets.torch_lowering.attention import _sdpa  # noqa: E402

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
