"""Causal key-block skipping in the native attention kernel (`attention.c`'s P_CAUSAL,
`native_attention.attend_causal`, `attention.causal_offset`): the kernel against a float64
`scaled_dot_product_attention` oracle (bf16 and float32, sequences not a multiple of the row or
key block, more keys than queries, strided head views, 1 and 2 threads) and bitwise against the
full kernel reading the causal mask; NaN where a row sees it propagates as before; the lowering
takes a literal lower triangle as causal only where it is exactly one, runs it causal in runs
whose padding mask is all zero and the full route in runs where it is not, and the switch
`PGX_CPU_NATIVE_ATTENTION_CAUSAL=0`; small stacks and GPT-2 against numpy / ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import torch.nn.functional as F  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import native_attention  # noqa: E402
from tests.helpers import compile_bf16, rel_rms_np  # noqa: E402
from tests.targets.test_cpu_transformer_speedpath import (  # noqa: E402
    reference,
    softmax,
    stacked_attention,
)


def _why_not(dtype: torch.dtype) -> str | None:
    if native.compiler_command() is None:
        return "no C compiler"
    try:
        native_attention.kernel(dtype)
    except native.NativeUnavailable as exc:
        return str(exc)
    return None


_WHY = {torch.bfloat16: _why_not(torch.bfloat16), torch.float32: _why_not(torch.float32)}
pytestmark = pytest.mark.skipif(
    _WHY[torch.float32] is not None, reason=f"native attention kernel: {_WHY[torch.float32]}"
)
DTYPES = [
    pytest.param(torch.float32, id="f32"),
    pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.skipif(
        _WHY[torch.bfloat16] is not None, reason=f"no bf16 kernel: {_WHY[torch.bfloat16]}")),
]  # fmt: skip
#: relative RMS error against float64: bf16 operands (probabilities rounded to bf16), float32
TOL = {torch.bfloat16: 1e-2, torch.float32: 2e-6}
CAUSAL = native_attention.FIELDS.index("CAUSAL")


def operands(b: int, h: int, s: int, t: int, d: int, dtype: torch.dtype, seed: int = 0):
    """Q, K^T, V: Q and V strided head views of fused products, K^T a transposed view."""
    g = torch.Generator().manual_seed(seed)
    qv = torch.randn(b, s, 2 * h * d, generator=g).to(dtype)
    q = qv[..., : h * d].view(b, s, h, d).transpose(1, 2)
    kv = torch.randn(b, t, 2 * h * d, generator=g).to(dtype)
    k = kv[..., : h * d].view(b, t, h, d).transpose(1, 2)
    v = kv[..., h * d :].view(b, t, h, d).transpose(1, 2)
    return q, k.transpose(-1, -2), v


def oracle(q, kt, v, offset: int, scale: float) -> torch.Tensor:
    """float64 SDPA with a boolean mask keeping keys j <= i + offset."""
    s, t = q.shape[-2], kt.shape[-1]
    keep = torch.ones(s, t, dtype=torch.bool).tril(offset)
    return F.scaled_dot_product_attention(
        q.double(), kt.double().transpose(-1, -2), v.double(), attn_mask=keep, scale=scale)


def rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float(((got - want) ** 2).mean().sqrt() / (want**2).mean().sqrt())


def causal_mask(s: int, t: int, offset: int) -> torch.Tensor:
    """The lowering's mask before (`where(tril, 0, finfo.min)`), (1, 1, s, t) float32."""
    keep = torch.ones(s, t, dtype=torch.bool).tril(offset)
    return torch.where(keep, 0.0, torch.finfo(torch.float32).min).view(1, 1, s, t)


def with_threads(n: int, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "shape",  # (b, h, s, t, d): s and t not multiples of 16 or 32, t > s, one query, d 32 / 80
    [(1, 3, 77, 77, 64), (2, 2, 130, 130, 32), (1, 2, 40, 45, 80), (2, 2, 1, 9, 64),
     (1, 2, 33, 33, 64), (1, 1, 200, 256, 64)],
)  # fmt: skip
def test_causal_block_matches_float64_and_the_full_kernel_bitwise(shape, threads, dtype):
    b, h, s, t, d = shape
    q, kt, v = operands(b, h, s, t, d, dtype)
    offset, scale = t - s, d**-0.5
    table: dict = {}
    run = native_attention.attend_causal(scale, table, dtype, offset)
    assert run is not None
    got = with_threads(threads, lambda: run(q, kt, v))
    (plan,) = [p for p in table[native_attention.PLANS].values() if p is not None]
    assert plan.params[CAUSAL] == 1
    assert got.dtype == dtype and tuple(got.shape) == (b, h, s, d)
    want = oracle(q, kt, v, offset, scale)
    assert 0 < rel_rms(got, want) < TOL[dtype]
    full = native_attention.attend(scale, {}, pytest.fail, dtype)
    before = with_threads(threads, lambda: full(q, kt, v, causal_mask(s, t, offset)))
    torch.testing.assert_close(got, before, rtol=0, atol=0)  # masked keys weigh exactly 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_offset_smaller_than_t_minus_s_and_one_key(dtype):
    """An offset other than t - s (keys past i + offset never seen), and t = 1."""
    q, kt, v = operands(2, 2, 50, 70, 64, dtype, seed=3)
    got = native_attention.attend_causal(0.125, {}, dtype, 3)(q, kt, v)
    assert rel_rms(got, oracle(q, kt, v, 3, 0.125)) < TOL[dtype]
    q, kt, v = operands(1, 2, 1, 1, 32, dtype, seed=4)
    got = native_attention.attend_causal(0.125, {}, dtype, 0)(q, kt, v)
    torch.testing.assert_close(got.double(), v.double(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_propagates_where_a_row_sees_it(dtype):
    """NaN in a query row, or in a key / value that a row sees, makes that row NaN, as in the
    full kernel; rows that do not see a NaN key (causally masked) are its oracle without it."""
    s, d = 70, 64
    q, kt, v = operands(1, 2, s, s, d, dtype, seed=5)
    q, kt, v = q.clone(), kt.clone(), v.clone()
    q[0, 0, 10] = float("nan")
    kt[0, 1, :, 40] = float("nan")
    run = native_attention.attend_causal(0.125, {}, dtype, 0)
    got = run(q, kt, v)
    full = native_attention.attend(0.125, {}, pytest.fail, dtype)(q, kt, v, causal_mask(s, s, 0))
    for out in (got, full):
        assert torch.isnan(out[0, 0, 10]).all()
        assert torch.isnan(out[0, 1, 40:]).all()
    clean_q, clean_k = q.clone(), kt.clone()
    clean_q[0, 0, 10] = 0.0
    clean_k[0, 1, :, 40] = 0.0
    want = oracle(clean_q, clean_k, v, 0, 0.125)
    rows = [i for i in range(s) if i != 10]
    assert not torch.isnan(got[0, 0, rows]).any() and not torch.isnan(got[0, 1, :40]).any()
    assert rel_rms(got[0, 0, rows], want[0, 0, rows]) < TOL[dtype]
    assert rel_rms(got[0, 1, :40], want[0, 1, :40]) < TOL[dtype]
    v[0, 0, 0, 3] = float("nan")  # key 0: every row of head 0 sees it
    assert torch.isnan(run(q, kt, v)[0, 0, :, 3]).all()


def test_switch_and_negative_offset():
    assert native_attention.attend_causal(0.125, {}, torch.float32, -1) is None
    mp = pytest.MonkeyPatch()
    mp.setenv(native_attention.CAUSAL_ENV, "0")
    try:
        assert native_attention.attend_causal(0.125, {}, torch.float32, 0) is None
    finally:
        mp.undo()


# ---- the lowering ----


def counting_kernel(monkeypatch) -> list[str]:
    """Patch `Plan.run` to record 'causal' / 'full' per call."""
    calls: list[str] = []
    run = native_attention.Plan.run

    def counted(self, *args):
        calls.append("causal" if self.params[CAUSAL] else "full")
        return run(self, *args)

    monkeypatch.setattr(native_attention.Plan, "run", counted)
    return calls


def compile_f32(model) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget())
    return prog


#: a stack whose blocks have 2 * 4 * 64 * 64 = 32K scores: float32 takes the native kernel
STACK = dict(layers=3, b=2, h=4, s=64, e=16)


@pytest.mark.parametrize("kind", ["causal", "causal_only", "causal_inverted"])
def test_stack_runs_causal_where_unpadded_and_full_where_padded(kind, monkeypatch):
    calls = counting_kernel(monkeypatch)
    model, feeds = stacked_attention(kind, **STACK)
    prog = compile_f32(model)
    feed_sets = [feeds]
    if "mask" in feeds:  # all zero: causal; padded: the full route; zero again: causal
        zero = {**feeds, "mask": np.zeros_like(feeds["mask"])}
        feed_sets = [zero, feeds, zero]
    for f in feed_sets:
        calls.clear()
        got = np.array(prog.run(f)[0])
        np.testing.assert_allclose(got, reference(kind, f, layers=3), rtol=2e-5, atol=2e-5)
        padded = "mask" in f and f["mask"].any()
        assert calls == ["full" if padded else "causal"] * 3


def test_switch_off_keeps_the_full_kernel(monkeypatch):
    calls = counting_kernel(monkeypatch)
    monkeypatch.setenv(native_attention.CAUSAL_ENV, "0")
    model, feeds = stacked_attention("causal_only", **STACK)
    got = np.array(compile_f32(model).run(feeds)[0])
    np.testing.assert_allclose(got, reference("causal_only", feeds, layers=3), rtol=2e-5,
                               atol=2e-5)  # fmt: skip
    assert calls == ["full"] * 3


@pytest.mark.parametrize("change", ["band", "one_flipped", "upper"])
def test_a_keep_mask_that_is_not_a_lower_triangle_takes_the_full_route(change, monkeypatch):
    """A literal keep mask that differs from tril anywhere (a band, one entry, tril(-1)'s
    complement) is not causal: the full kernel reads it."""
    calls = counting_kernel(monkeypatch)
    model, feeds = stacked_attention("causal_only", **STACK)
    s = STACK["s"]
    keep = np.tril(np.ones((s, s), bool))
    if change == "band":
        keep &= np.triu(np.ones((s, s), bool), -5)
    elif change == "one_flipped":
        keep[40, 3] = False
    else:
        keep = np.triu(np.ones((s, s), bool))
    from onnx import numpy_helper

    (init,) = [i for i in model.graph.initializer if i.name == "causal"]
    init.CopyFrom(numpy_helper.from_array(keep, "causal"))
    got = np.array(compile_f32(model).run(feeds)[0])
    assert calls == ["full"] * 3
    q, k, v = (feeds[n].astype(np.float64) for n in "qkv")
    scale = np.float64(np.float32(1 / np.sqrt(STACK["e"])))
    x = q
    for i in range(3):
        x = x + q if i else x
        x = softmax(np.where(keep, (x @ k.transpose(0, 1, 3, 2)) * scale, -3.4e38)) @ v
    np.testing.assert_allclose(got, x, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("bf16", [False, True], ids=["f32", "bf16"])
def test_gpt2_against_ort_causal_and_padded(bf16, monkeypatch):
    """A small GPT-2 (2 layers, 2 heads of 64, s 128, batch 2: 64K scores a block): causal in an
    unpadded run, the full route in a padded one; both against ONNX Runtime float32 (the padded
    sequence's valid positions), and the same numbers as the switch off."""
    if bf16 and _WHY[torch.bfloat16] is not None:
        pytest.skip(f"no bf16 kernel: {_WHY[torch.bfloat16]}")
    from pygraphx.models.gpt2 import GPT2Config, build_gpt2

    calls = counting_kernel(monkeypatch)
    config = GPT2Config(hidden=128, layers=2, heads=2, vocab_size=100)
    model = build_gpt2(batch=2, seq_len=128, seed=3, config=config)
    ids = np.random.default_rng(1).integers(0, 100, (2, 128)).astype(np.int64)
    padded = np.ones_like(ids)
    padded[1, 100:] = 0
    runs = [{"input_ids": ids, "attention_mask": np.ones_like(ids)},
            {"input_ids": ids, "attention_mask": padded}]  # fmt: skip
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(native_attention.CAUSAL_ENV, switch)
        prog = compile_bf16(model) if bf16 else compile_f32(model)
        for n, f in enumerate(runs):
            calls.clear()
            got = np.array(prog.run(f)[0])
            outs[switch, n] = got
            want = sess.run(None, f)[0]
            valid = (slice(None), slice(0, 100)) if n else (slice(None),)
            assert rel_rms_np(got[valid], want[valid]) < (2e-2 if bf16 else 1e-5)
            assert calls == ["causal" if switch == "1" and n == 0 else "full"] * 2
    for n in range(len(runs)):
        np.testing.assert_array_equal(outs["1", n], outs["0", n])
