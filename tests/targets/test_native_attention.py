"""The native bf16 attention kernel (`native/kernels/attention.c`, `native_attention.py`): the
block against a float64 oracle of the same bf16 operands and against the oneDNN route it
replaces (odd sequence lengths, head widths 32 / 64 / 80, no / broadcast / causal / bf16 /
per-head masks, strided head views of a fused QKV product, dense and 3-axis operands, 1 and 2
threads), operands it does not take sent to the fallback, the switch, and whole bf16 programs
against ONNX Runtime at float32."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import attention, native_attention  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_attention  # noqa: E402


def _why_not() -> str | None:
    if native.compiler_command() is None:
        return "no C compiler"
    try:
        native_attention.kernel()
    except native.NativeUnavailable as exc:
        return str(exc)
    return None


_WHY = _why_not()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"native attention kernel: {_WHY}")

#: relative RMS error of a bf16 block against float64 (probabilities rounded to bf16)
BF16_RMS = 1e-2


def qkv_views(b: int, h: int, s: int, d: int, seed: int = 0) -> tuple:
    """Q, K^T and V as the strided head views of one fused (b, s, 3*h*d) bf16 product."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, s, 3 * h * d, generator=g).bfloat16()
    q, k, v = (qkv[..., i * h * d : (i + 1) * h * d].view(b, s, h, d).transpose(1, 2)
               for i in range(3))  # fmt: skip
    return q, k.transpose(-1, -2), v


def dense_operands(b: int, h: int, s: int, t: int, d: int, seed: int = 0) -> tuple:
    """Dense Q (b, h, s, d), K^T (a transposed view of a dense K) and V, s != t allowed."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s, d, generator=g).bfloat16()
    k = torch.randn(b, h, t, d, generator=g).bfloat16()
    v = torch.randn(b, h, t, d, generator=g).bfloat16()
    return q, k.transpose(-1, -2), v


def oracle(q, kt, v, mask, scale: float) -> torch.Tensor:
    x = (q.double() @ kt.double()) * scale
    if mask is not None:
        x = x + mask.double()
    return torch.softmax(x, -1) @ v.double()


def rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float(((got - want) ** 2).mean().sqrt() / (want**2).mean().sqrt())


#: relative RMS error of a float32 block against float64
F32_RMS = 2e-6


def make_mask(form: str, b: int, h: int, s: int, t: int) -> torch.Tensor | None:
    """The mask forms the lowering passes (compact: broadcast axes of length 1 or stride 0)."""
    g = torch.Generator().manual_seed(7)
    pad = torch.where(torch.rand(b, 1, 1, t, generator=g) < 0.3, -1e4, 0.0)
    pad[..., 0] = 0.0  # every row keeps one key
    if form == "none":
        return None
    if form == "padding":
        return pad
    if form == "padding_view":
        return pad.expand(b, h, s, t)
    if form == "bf16":
        return pad.bfloat16()
    if form == "causal":  # GPT-2's: the last s of t keys visible up to the query's position
        return torch.triu(torch.full((s, t), -3.4e38), t - s + 1).view(1, 1, s, t)
    if form == "bias":  # per head, not dense
        return torch.randn(1, h, t, s, generator=g).transpose(-1, -2)
    raise ValueError(form)


def route(scale: float):
    """The route before: oneDNN's primitives where loaded, else torch's three steps."""
    torch_route = attention._bf16_attention(scale)
    if not onednn_attention.available():
        return torch_route
    return onednn_attention.attend(scale, {}, torch_route)


def plans(table: dict) -> list:
    return [p for p in table.get(native_attention.PLANS, {}).values() if p is not None]


@pytest.mark.parametrize("tiles", ["wide", "4"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("form", ["none", "padding", "padding_view", "bf16", "causal", "bias"])
@pytest.mark.parametrize(
    "shape", [(1, 3, 77, 77, 64), (2, 2, 33, 33, 32), (1, 2, 40, 40, 80), (2, 2, 1, 1, 32)]
)
def test_block_matches_float64_and_the_route_before(shape: tuple, form: str, threads: int,
                                                    tiles: str, monkeypatch):
    """bf16 blocks; `tiles` wide (the default) packs K by 16 x 16 transposes of bf16 pairs
    (d = 32, 64, 80: one, two, two whole pair blocks and a rest), 4 pair by pair."""
    monkeypatch.setenv(native_attention.TILES_ENV, tiles)
    b, h, s, t, d = shape
    q, kt, v = qkv_views(b, h, s, d)
    mask = make_mask(form, b, h, s, t)
    scale = d**-0.5
    table: dict = {}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = native_attention.attend(scale, table, pytest.fail)(q, kt, v, mask)
    finally:
        torch.set_num_threads(before)
    (plan,) = plans(table)
    assert plan.params[native_attention.FIELDS.index("THREADS")] == threads
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (b, h, s, d)
    assert got.transpose(1, 2).is_contiguous()  # laid out (b, s, h, d): the model's next view
    want = oracle(q, kt, v, mask, scale)
    err, before_err = rel_rms(got, want), rel_rms(route(scale)(q, kt, v, mask), want)
    assert 0 < err < BF16_RMS or (s == t == 1 and err == 0)
    assert err <= 1.2 * before_err + 1e-6


@pytest.mark.parametrize("form", ["none", "padding", "causal"])
@pytest.mark.parametrize("st", [(1, 77), (5, 77), (77, 1), (130, 47), (3, 2049)])
def test_query_and_key_lengths_differ(st: tuple, form: str):
    """Decoder-like shapes (one query over 77 keys), one key, more queries than a row block."""
    s, t = st
    b, h, d = 2, 3, 64
    q, kt, v = dense_operands(b, h, s, t, d)
    mask = make_mask(form, b, h, s, t) if not (form == "causal" and s > t) else None
    table: dict = {}
    got = native_attention.attend(0.125, table, pytest.fail)(q, kt, v, mask)
    assert plans(table)
    want = oracle(q, kt, v, mask, 0.125)
    assert rel_rms(got, want) < BF16_RMS
    assert rel_rms(got, want) <= 1.2 * rel_rms(route(0.125)(q, kt, v, mask), want) + 1e-6


def test_three_axis_operands_and_masked_out_keys_get_no_weight():
    """(h, s, d) operands; a key masked out with -1e4 (or -inf-like) contributes nothing: its
    V row may hold anything finite."""
    q, kt, v = dense_operands(1, 4, 50, 50, 32)
    q, kt, v = q[0], kt[0], v[0].clone()
    mask = torch.zeros(1, 50)
    mask[0, 40:] = -3.4e38
    v[:, 40:] = 1e4
    got = native_attention.attend(0.2, {}, pytest.fail)(q, kt, v, mask)
    want = oracle(q, kt[..., :40], v[:, :40], None, 0.2)
    assert rel_rms(got, want) < BF16_RMS


def test_output_is_bitwise_the_same_on_one_and_two_threads():
    q, kt, v = qkv_views(2, 3, 70, 64)
    mask = make_mask("padding", 2, 3, 70, 70)
    outs = []
    before = torch.get_num_threads()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            outs.append(native_attention.attend(0.125, {}, pytest.fail)(q, kt, v, mask))
        finally:
            torch.set_num_threads(before)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_operands_the_kernel_does_not_take_go_to_the_fallback():
    calls = []

    def fallback(q, kt, v, mask):
        calls.append(1)
        return oracle(q, kt, v, mask, 0.5).to(q.dtype)

    table: dict = {}
    run = native_attention.attend(0.5, table, fallback)
    q, kt, v = qkv_views(2, 2, 8, 6)
    odd_q, odd_kt, odd_v = dense_operands(2, 2, 8, 8, 5)  # an odd head width
    run(odd_q, odd_kt, odd_v, None)
    run(q.half(), kt.half(), v.half(), None)  # float16
    run(q.float(), kt.float(), v, None)  # mixed types
    run(q, kt.contiguous(), v, None)  # K^T dense: its head axis strided
    assert len(calls) == 4 and not plans(table)
    shared_k = kt[:1].expand(2, 2, 6, 8)  # a broadcast batch axis (stride 0): taken
    got = run(q, shared_k, v, None)
    assert len(calls) == 4 and len(plans(table)) == 1
    assert rel_rms(got, oracle(q, shared_k, v, None, 0.5)) < BF16_RMS
    run(q, kt, v, torch.zeros(2, 1, 1, 8, dtype=torch.float16))  # a half mask
    assert len(calls) == 5 and len(plans(table)) == 1
    strided_keys = torch.randn(2, 1, 1, 16)[..., ::2]  # key axis strided: copied, taken
    got = run(q, kt, v, strided_keys)
    assert len(calls) == 5 and len(plans(table)) == 2
    assert rel_rms(got, oracle(q, kt, v, strided_keys, 0.5)) < BF16_RMS


def test_unavailable_kernel_is_announced_and_the_route_runs(monkeypatch, caplog):
    monkeypatch.setattr(native_attention, "_kernels", {})
    monkeypatch.setattr(native_attention, "_why", native.NativeUnavailable("native kernel x"))
    monkeypatch.setattr(native.compiler, "_ANNOUNCED", set())
    fallback = attention._bf16_attention(0.5)
    with caplog.at_level("WARNING", logger="pygraphx.cpu"):
        assert native_attention.attend(0.5, {}, fallback) is fallback
    assert "the oneDNN attention route runs instead" in caplog.text


def compile_bf16(model) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget())
    return prog


def small_model(name: str) -> tuple:
    """A 2-layer BERT or GPT-2 (batch 2, the second sequence padded) and its inputs."""
    from pygraphx.models.bert import BertConfig, build_bert
    from pygraphx.models.gpt2 import GPT2Config, build_gpt2

    ids = np.random.default_rng(6).integers(0, 100, (2, 16)).astype(np.int64)
    keep = np.ones_like(ids)
    keep[1, 11:] = 0
    feeds = {"input_ids": ids, "attention_mask": keep}
    sizes = {"hidden": 64, "layers": 2, "heads": 2, "vocab_size": 100}
    if name == "gpt2":
        config = GPT2Config(**sizes, n_positions=32)
        return build_gpt2(batch=2, seq_len=16, seed=5, config=config), feeds
    config = BertConfig(**sizes, intermediate=128)
    feeds["token_type_ids"] = ids * 0
    return build_bert(batch=2, seq_len=16, seed=5, config=config), feeds


def rel_rms_np(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)))


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_bf16_program_attention_runs_native_and_the_switch_keeps_the_route(name, monkeypatch):
    """A bf16 transformer's blocks run on the kernel (on by default, off with
    `PGX_CPU_NATIVE_ATTENTION=0`); both within bf16's error of ONNX Runtime at float32, the
    kernel's no worse than the route before."""
    model, feeds = small_model(name)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    errors = {}
    for on in (True, False):
        monkeypatch.setenv(native_attention.ENV, "1" if on else "0")
        prog = compile_bf16(model)
        exe = prog._executable
        assert exe.attention_blocks == 2
        got = prog.run(feeds)
        table = exe.lowered.ctx.cache.get(attention.NATIVE_TABLE, {})
        assert bool(plans(table)) == on
        errors[on] = max(rel_rms_np(g, w) for g, w in zip(got, want, strict=True))
    assert 1e-5 < errors[True] < 3e-2 and 1e-5 < errors[False] < 3e-2
    assert errors[True] <= 1.2 * errors[False]


@pytest.mark.parametrize("fill", [-3.4e38, -1e4])
def test_a_row_masked_out_everywhere_gets_uniform_weights(fill: float):
    """As torch (and the oneDNN route) computes it: all scores equally far down."""
    q, kt, v = dense_operands(1, 2, 6, 20, 32)
    mask = torch.zeros(1, 1, 6, 20)
    mask[0, 0, 2] = fill
    got = native_attention.attend(0.125, {}, pytest.fail)(q, kt, v, mask)
    want = oracle(q, kt, v, mask, 0.125)
    assert torch.isfinite(got).all()
    assert rel_rms(got, want) < BF16_RMS
    assert rel_rms(got[:, :, 2], want[:, :, 2]) < BF16_RMS


@pytest.mark.parametrize("tiles", ["wide", "4"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("form", ["none", "padding_view", "bf16", "causal", "bias"])
@pytest.mark.parametrize("shape", [(1, 3, 77, 77, 64), (2, 2, 33, 33, 32), (1, 2, 5, 40, 80),
                                   (2, 2, 1, 1, 32), (1, 2, 17, 17, 7),
                                   (1, 2, 45, 45, 48)])  # fmt: skip
def test_float32_block_matches_float64(shape: tuple, form: str, threads: int, tiles: str,
                                       monkeypatch):
    """The FMA variant: odd head widths too, every mask form, within float32's error; with
    the wide register tiles (the default: 6 / 8 / 12 rows at 3-4 / 2 / 1 column vectors,
    remainders of every width and row count in these shapes) and the 4-row ones."""
    monkeypatch.setenv(native_attention.TILES_ENV, tiles)
    b, h, s, t, d = shape
    if s == t:
        q, kt, v = (x.float() for x in qkv_views(b, h, s, d))
        q, kt, v = q + 0.01 * torch.randn_like(q), kt, v  # not only bf16 values
    else:
        q, kt, v = (x.float() for x in dense_operands(b, h, s, t, d))
    mask = make_mask(form, b, h, s, t)
    table: dict = {}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = native_attention.attend(d**-0.5, table, pytest.fail)(q, kt, v, mask)
    finally:
        torch.set_num_threads(before)
    assert plans(table) and got.dtype == torch.float32 and tuple(got.shape) == (b, h, s, d)
    assert got.transpose(1, 2).is_contiguous()
    want = oracle(q, kt, v, mask, d**-0.5)
    assert 0 < rel_rms(got, want) < F32_RMS or (s == t == 1 and rel_rms(got, want) < 1e-7)


def test_tiles_switch_takes_two_values(monkeypatch):
    """`PGX_CPU_NATIVE_ATTENTION_TILES`: wide (also unset) or 4; another value is an error."""
    monkeypatch.delenv(native_attention.TILES_ENV, raising=False)
    assert native_attention.wide_tiles()
    monkeypatch.setenv(native_attention.TILES_ENV, "4")
    assert not native_attention.wide_tiles()
    monkeypatch.setenv(native_attention.TILES_ENV, "8")
    with pytest.raises(ValueError, match="TILES"):
        native_attention.wide_tiles()


def compile_float32(model) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget())
    return prog


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_float32_program_attention_runs_native_above_the_size_floor(name, monkeypatch):
    """A float32 transformer's blocks run on the kernel from `ONEDNN_F32_MIN` scores (off with
    `PGX_CPU_NATIVE_ATTENTION_F32=0`), as close to ONNX Runtime as the route before."""
    model, feeds = small_model(name)  # (2, 2, 16, 16) scores: 1024
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for floor, switch, native_runs in ((1024, "1", True), (1025, "1", False), (1024, "0", False)):
        monkeypatch.setattr(attention, "ONEDNN_F32_MIN", floor)
        monkeypatch.setenv(attention.NATIVE_F32_ENV, switch)
        prog = compile_float32(model)
        got = prog.run(feeds)
        table = prog._executable.lowered.ctx.cache.get(attention.NATIVE_TABLE, {})
        assert bool(plans(table)) == native_runs
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tiles", ["wide", "4"])
def test_float32_program_takes_the_tiles_switch_at_compile(tiles, monkeypatch):
    """`PGX_CPU_NATIVE_ATTENTION_TILES` as set when the program is compiled decides its blocks'
    tiles (the plans are made at the first run, after the variable may have changed); the
    outputs match ONNX Runtime either way."""
    model, feeds = small_model("bert")
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    monkeypatch.setattr(attention, "ONEDNN_F32_MIN", 1024)
    monkeypatch.setenv(native_attention.TILES_ENV, tiles)
    prog = compile_float32(model)
    monkeypatch.setenv(native_attention.TILES_ENV, "4" if tiles == "wide" else "wide")
    got = prog.run(feeds)
    table = prog._executable.lowered.ctx.cache.get(attention.NATIVE_TABLE, {})
    found = plans(table)
    field = native_attention.FIELDS.index("TILES")
    assert found and all(p.params[field] == (tiles == "wide") for p in found)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
