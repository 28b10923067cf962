"""bf16 attention on the CPU through oneDNN's primitives (`torch_lowering/onednn_attention.py`):
the block against a float64 oracle of the same bf16 operands and against torch's three-step
route, strided head views of a fused QKV product, every mask form the lowering passes, the
primitives shared between blocks and made per thread count, operands they do not take sent to
the fallback, and whole bf16 programs against ONNX Runtime at float32."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from pygraphx.targets.torch_lowering import attention, onednn_attention  # noqa: E402
from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16  # noqa: E402
from tests.helpers import compile_bf16, rel_rms_np, small_model  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (onednn_attention.available() and cpu_has_bf16()),
    reason="needs oneDNN's C API library and a processor with bf16 instructions",
)

#: relative RMS error of a bf16 block against float64 (probabilities rounded to bf16)
BF16_RMS = 1e-2


@pytest.fixture(autouse=True)
def _onednn_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the oneDNN route: bf16 programs keep their blocks off the native
    kernel that runs first (`test_native_attention.py`)."""
    from pygraphx.targets.torch_lowering import native_attention

    monkeypatch.setenv(native_attention.ENV, "0")


def qkv_views(b: int, h: int, s: int, d: int, seed: int = 0) -> tuple:
    """Q, K^T and V as the strided head views of one fused (b, s, 3*h*d) bf16 product."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, s, 3 * h * d, generator=g).bfloat16()
    q, k, v = (qkv[..., i * h * d : (i + 1) * h * d].view(b, s, h, d).transpose(1, 2)
               for i in range(3))  # fmt: skip
    return q, k.transpose(-1, -2), v


def primitives(table: dict) -> int:
    """How many sets of primitives `table` holds (besides its plans)."""
    return sum(1 for k in table if k != onednn_attention.PLANS)


def oracle(q, kt, v, mask, scale: float) -> torch.Tensor:
    x = (q.double() @ kt.double()) * scale
    if mask is not None:
        x = x + mask.double()
    return torch.softmax(x, -1) @ v.double()


def rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float(((got - want) ** 2).mean().sqrt() / (want**2).mean().sqrt())


def masks(b: int, h: int, s: int) -> dict:
    """The mask forms the lowering passes: none, a padding mask broadcast over heads and
    queries (a stride-0 view), a bf16 keep-mask, a float32 causal (s, s) one, a float32
    per-head bias that is not dense."""
    pad = torch.where(torch.rand(b, 1, 1, s) < 0.3, -1e4, 0.0)
    causal = torch.triu(torch.full((s, s), -3.4e38), 1)
    return {
        "none": None,
        "padding_view": pad.expand(b, h, s, s),
        "bf16": pad.bfloat16(),
        "causal": causal.view(1, 1, s, s),  # (b > 1: broadcast to the scores, copied)
        "bias_strided": torch.randn(1, h, s, s).transpose(-1, -2),  # copied to a dense one
    }


@pytest.mark.parametrize("form", ["none", "padding_view", "bf16", "causal", "bias_strided"])
@pytest.mark.parametrize("shape", [(1, 4, 32, 16), (3, 2, 20, 8)])
def test_block_matches_float64_and_the_torch_route(form: str, shape: tuple) -> None:
    b, h, s, d = shape
    torch.manual_seed(1)
    q, kt, v = qkv_views(b, h, s, d)
    mask = masks(b, h, s)[form]
    scale = d**-0.5
    torch_route = attention._bf16_attention(scale)
    table: dict = {}
    got = onednn_attention.attend(scale, table, torch_route)(q, kt, v, mask)
    assert primitives(table) == 1, "the primitives ran (no fallback)"
    (plan,) = table[onednn_attention.PLANS].values()
    assert not any(impl.startswith("ref") for impl in plan.prims.impls), plan.prims.impls
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (b, h, s, d)
    assert got.transpose(1, 2).is_contiguous()  # laid out (b, s, h, d): the model's next view
    want = oracle(q, kt, v, mask, scale)
    err, torch_err = rel_rms(got, want), rel_rms(torch_route(q, kt, v, mask), want)
    assert 0 < err < BF16_RMS
    # float32 scores (no bf16 rounding before the softmax): no worse than the torch route
    assert err <= 1.2 * torch_err


@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_scale_one_has_no_scale_post_op(scale: float) -> None:
    """A unit scale adds no post-op: the mask is then the first one."""
    q, kt, v = qkv_views(2, 2, 12, 8)
    mask = masks(2, 2, 12)["padding_view"]
    got = onednn_attention.attend(scale, {}, attention._bf16_attention(scale))(q, kt, v, mask)
    assert rel_rms(got, oracle(q, kt, v, mask, scale)) < BF16_RMS


def test_primitives_are_shared_by_blocks_and_made_per_thread_count() -> None:
    q, kt, v = qkv_views(1, 2, 16, 8)
    q2, kt2, v2 = qkv_views(1, 2, 16, 8, seed=3)
    table: dict = {}
    run = onednn_attention.attend(0.25, table, attention._bf16_attention(0.25))
    other = onednn_attention.attend(0.25, table, attention._bf16_attention(0.25))
    a, b = run(q, kt, v, None), other(q2, kt2, v2, None)
    assert primitives(table) == 1
    assert rel_rms(a, oracle(q, kt, v, None, 0.25)) < BF16_RMS
    assert rel_rms(b, oracle(q2, kt2, v2, None, 0.25)) < BF16_RMS
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if before > 1 else 2)
        c = run(q, kt, v, None)
    finally:
        torch.set_num_threads(before)
    assert primitives(table) == 2
    torch.testing.assert_close(c, a, rtol=0, atol=0)


def test_operands_the_primitives_do_not_take_go_to_the_fallback() -> None:
    calls = []

    def fallback(q, kt, v, mask):
        calls.append(1)
        return attention._bf16_attention(0.5)(q, kt, v, mask)

    q, kt, v = qkv_views(2, 2, 8, 4)
    table: dict = {}
    run = onednn_attention.attend(0.5, table, fallback)
    shared_k = kt[:1].expand(2, 2, 4, 8)  # a batch axis broadcast (stride 0)
    got = run(q, shared_k, v, None)
    assert calls and not primitives(table)
    assert rel_rms(got, oracle(q, shared_k, v, None, 0.5)) < BF16_RMS
    run(q.float(), kt.float(), v.bfloat16(), None)  # mixed types
    assert len(calls) == 2 and not primitives(table)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_bf16_program_attention_runs_on_onednn(name: str) -> None:
    """A bf16 transformer's attention blocks run on the primitives (made at the first run; on by
    default, off with `onednn_attention=False`); both within bf16's error of ONNX Runtime at
    float32, the primitives' no worse than torch's route."""
    model, feeds = small_model(name)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    errors = {}
    for on in (True, False):
        prog = compile_bf16(model, **({} if on else {"onednn_attention": False}))
        exe = prog._executable
        assert exe.attention_blocks == 2
        got = prog.run(feeds)
        assert bool(exe.lowered.ctx.cache.get(attention.ONEDNN_TABLE)) == on
        errors[on] = max(rel_rms_np(g, w) for g, w in zip(got, want, strict=True))
    assert 1e-5 < errors[True] < 3e-2 and 1e-5 < errors[False] < 3e-2
    assert errors[True] <= 1.2 * errors[False]


def test_a_refused_plan_goes_to_the_fallback_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args, **kwargs):
        raise onednn_attention.OneDnnError("no fast matmul")

    monkeypatch.setattr(onednn_attention, "Plan", refuse)
    q, kt, v = qkv_views(1, 2, 8, 4)
    table: dict = {}
    run = onednn_attention.attend(0.5, table, attention._bf16_attention(0.5))
    with caplog.at_level("WARNING", logger="pygraphx.cpu"):
        got = run(q, kt, v, None)
        run(q, kt, v, None)
    assert [r.getMessage() for r in caplog.records if "instead of oneDNN" in r.getMessage()]
    assert len(caplog.records) == 1  # once per signature
    assert rel_rms(got, oracle(q, kt, v, None, 0.5)) < BF16_RMS


def test_bf16_program_on_two_threads_makes_primitives_for_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A program compiled for two threads runs its blocks on primitives made for two (oneDNN
    fixes a primitive's team at creation), with the same results as on one thread."""
    from pygraphx.targets.cpu.threads import LOAD_ADAPT_ENV

    monkeypatch.setenv(LOAD_ADAPT_ENV, "0")  # two threads even on a busy machine
    model, feeds = small_model("bert")
    outs = {}
    for threads in (1, 2):
        prog = compile_bf16(model, threads=threads, step_threads=False)
        outs[threads] = [np.asarray(o) for o in prog.run(feeds)]
        table = prog._executable.lowered.ctx.cache[attention.ONEDNN_TABLE]
        counts = {key[-1] for key in table if key != onednn_attention.PLANS}
        assert counts == {threads}
    for a, b in zip(outs[1], outs[2], strict=True):
        assert rel_rms_np(a, b) < 1e-2
