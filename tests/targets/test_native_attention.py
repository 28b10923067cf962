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
from tests.helpers import compile_bf16, rel_rms_np, small_model  # noqa: E402


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
    """Said once per operand type, naming the route that runs; the other type unaffected."""
    monkeypatch.setitem(native_attention._BITS, torch.bfloat16, (1 << 20, "ISA X"))
    monkeypatch.setattr(native.compiler, "_ANNOUNCED", set())
    fallback = attention._bf16_attention(0.5)
    with caplog.at_level("WARNING", logger="pygraphx.cpu"):
        assert native_attention.attend(0.5, {}, fallback, torch.bfloat16, "route A") is fallback
        assert native_attention.attend(0.5, {}, fallback, torch.bfloat16, "route A") is fallback
        run32 = native_attention.attend(0.5, {}, pytest.fail, torch.float32, "route B")
    assert run32 is not pytest.fail  # the float32 variant is had
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "built without ISA X" in said[0] and "route A runs" in said[0]


def test_float32_variant_is_built_without_avx512_bf16():
    """A build without AVX512_BF16 (Skylake-SP-like) still has the float32 kernel; its bf16
    variant is refused, naming the instruction set; the process's library is untouched."""
    flags = ("-mno-avx512bf16",)
    fn = native_attention.kernel(torch.float32, flags)
    assert native_attention.kernel(torch.float32) is not fn  # nothing kept
    q, kt, v = (x.float() for x in dense_operands(1, 2, 19, 23, 24))
    got = native_attention.Plan(fn, 0.3, q, kt, v, None, 1).run(q, kt, v, None)
    assert rel_rms(got, oracle(q, kt, v, None, 0.3)) < 1e-5
    with pytest.raises(native.NativeUnavailable, match="AVX-512 BF16"):
        native_attention.kernel(torch.bfloat16, flags)
    assert native_attention.kernel(torch.bfloat16) is not None  # a test build decides nothing


def test_a_failed_build_is_kept_for_the_process(monkeypatch, caplog):
    """As the other native kernels (`native.BoundLibrary`): a build failure (e.g. a timeout
    under load) is announced once and not started again by the next block or program of the
    process, whose blocks run on their route; a new process (a fresh library) builds again."""
    real = native.compiler.load_source
    calls = []

    def flaky(name, source, extra_flags=()):
        calls.append(name)
        if len(calls) == 1:
            raise native.NativeUnavailable("native kernel attention: build timed out (test)")
        return real(name, source, extra_flags)

    def fresh() -> native.BoundLibrary:  # the library as a new process finds it
        parts = native_attention._BOUND.parts
        return native.BoundLibrary(native_attention.KERNEL, native_attention._bind, (), parts)

    monkeypatch.setattr(native_attention, "_BOUND", fresh())
    monkeypatch.setattr(native.compiler, "load", lambda name, flags=(): flaky(
        name, native_attention._BOUND.source(), flags))  # fmt: skip
    monkeypatch.setattr(native.compiler, "load_source", flaky)
    monkeypatch.setattr(native.compiler, "_ANNOUNCED", set())
    q, kt, v = dense_operands(1, 2, 8, 8, 16)
    fallback = attention._bf16_attention(0.5)
    with caplog.at_level("WARNING", logger="pygraphx.cpu"):
        for _ in range(3):  # three programs' blocks: one build, said once, the route runs
            run = native_attention.attend(0.5, {}, fallback, torch.bfloat16, "route C")
            assert run is fallback
            assert native_attention.attend_causal(0.5, {}, torch.bfloat16, 0) is None
            with pytest.raises(native.NativeUnavailable, match="timed out"):
                native_attention.kernel(torch.float32)
    assert len(calls) == 1
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "timed out (test)" in said[0] and "route C runs" in said[0]
    monkeypatch.setattr(native_attention, "_BOUND", fresh())  # a new process tries again
    run = native_attention.attend(0.5, {}, pytest.fail, torch.bfloat16, "route C")
    assert len(calls) == 2 and run is not fallback
    assert rel_rms(run(q, kt, v, None), oracle(q, kt, v, None, 0.5)) < BF16_RMS


def test_refused_operands_are_said_once_per_signature(caplog):
    q, kt, v = dense_operands(1, 2, 8, 8, 5)  # an odd head width
    run = native_attention.attend(0.5, {}, lambda *a: oracle(*a, 0.5).to(q.dtype),
                                  torch.bfloat16, "route C")  # fmt: skip
    with caplog.at_level("INFO", logger="pygraphx.cpu"):
        run(q, kt, v, None)
        run(q, kt, v, None)
    said = [r.getMessage() for r in caplog.records if "native attention" in r.getMessage()]
    assert len(said) == 1 and "odd d (5)" in said[0] and "route C" in said[0]


def test_a_kernel_failure_names_the_problem_and_the_sizes():
    q, kt, v = dense_operands(1, 2, 8, 8, 16)
    plan = native_attention.Plan(native_attention.kernel(), 0.5, q, kt, v, None, 1)
    plan.params[native_attention.FIELDS.index("SLOT")] = 64  # less than the kernel needs
    with pytest.raises(RuntimeError, match=r"status -1: no scratch .*B=1 H=2 S=8 T=8 D=16"):
        plan.run(q, kt, v, None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nan_in_the_mask_or_the_scores_propagates_as_in_torch(dtype):
    """NaN in a mask entry (or in the scores) makes that row's output NaN, as in torch / ONNX
    Runtime; the other rows are untouched."""
    q, kt, v = (x.to(dtype) for x in dense_operands(1, 2, 6, 40, 32))
    mask = torch.zeros(1, 2, 6, 40)
    mask[0, 0, 1, 3] = float("nan")  # row 1 of head 0
    mask[0, 1, 4, 37] = float("nan")  # row 4 of head 1, in the tail past 32 keys
    q = q.clone()
    q[0, 1, 2, 5] = float("inf")  # row 2 of head 1: inf * 0-crossing scores give NaN
    kt = kt.clone()
    kt[0, 1, 5, :] = 0.0
    for m in (mask, mask.bfloat16()):
        want = oracle(q, kt, v, m, 0.25)
        got = native_attention.Plan(native_attention.kernel(dtype), 0.25, q, kt, v, m, 1).run(
            q, kt, v, m)  # fmt: skip
        nan_rows = want.isnan().any(-1)
        assert nan_rows[0, 0, 1] and nan_rows[0, 1, 4] and nan_rows[0, 1, 2]
        assert torch.equal(got.float().isnan().all(-1), nan_rows)
        keep = ~nan_rows
        assert rel_rms(got[keep], want[keep]) < (BF16_RMS if dtype == torch.bfloat16 else 1e-5)


def test_short_lived_threads_leave_no_memory_behind():
    """Each Python thread that runs a program is the master of its own OpenMP team; a kernel
    scratch of its own (thread-local) leaked ~3.5 MB per such thread at this size."""
    import threading

    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith("VmRSS"))
        return int(line.split()[1]) / 1024

    q, kt, v = dense_operands(1, 1, 32, 8192, 64)
    plan = native_attention.Plan(native_attention.kernel(), 0.125, q, kt, v, None, 1)
    want = plan.run(q, kt, v, None)
    got = []
    before = rss_mb()
    for _ in range(40):
        th = threading.Thread(target=lambda: got.append(plan.run(q, kt, v, None)))
        th.start()
        th.join()
    grown = rss_mb() - before
    got.clear()
    assert grown < 30, f"RSS grew {grown:.0f} MB over 40 short-lived threads"
    torch.testing.assert_close(plan.run(q, kt, v, None), want, rtol=0, atol=0)


def test_the_scratch_is_shared_and_grown_not_reallocated_per_call():
    table: dict = {}
    run = native_attention.attend(0.5, table, pytest.fail)
    small = dense_operands(1, 2, 8, 8, 16)
    run(*small, None)
    scratch = table[native_attention.SCRATCH]
    first = scratch.address
    run(*small, None)
    assert scratch.address == first  # kept between calls
    big = dense_operands(1, 2, 8, 300, 16)
    got = run(*big, None)
    assert scratch.size >= max(p.need for p in plans(table))
    assert rel_rms(got, oracle(*big, None, 0.5)) < BF16_RMS
    got = run(*small, None)  # the smaller plan runs in the grown buffer
    assert rel_rms(got, oracle(*small, None, 0.5)) < BF16_RMS


def test_onednn_attention_false_keeps_bf16_blocks_on_torch(monkeypatch):
    """`CpuTarget(onednn_attention=False)` asks for torch's route: no native kernel either."""
    monkeypatch.setenv(native_attention.ENV, "1")
    model, feeds = small_model("bert")
    prog = compile_bf16(model, onednn_attention=False)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = prog.run(feeds)
    cache = prog._executable.lowered.ctx.cache
    assert not plans(cache.get(attention.NATIVE_TABLE, {}))
    assert not cache.get(attention.ONEDNN_TABLE)
    assert max(rel_rms_np(g, w) for g, w in zip(got, want, strict=True)) < 3e-2


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


def test_plans_run_from_several_threads_at_once_give_the_single_run_outputs():
    """Python threads running the same plans at once (outside a program's lock): a call that
    finds the plan's scratch in use takes one of its own; outputs bitwise the single run's."""
    import threading

    cases = []
    for s, t, d, seed in ((40, 77, 64, 1), (128, 700, 32, 2), (7, 300, 80, 3)):
        q, kt, v = dense_operands(2, 4, s, t, d, seed)
        plan = native_attention.Plan(native_attention.kernel(), 0.125, q, kt, v, None, 2)
        cases.append((plan, (q, kt, v, None), plan.run(q, kt, v, None)))
    bad = []

    def work(i: int) -> None:
        plan, args, want = cases[i % 3]
        for _ in range(15):
            if not torch.equal(plan.run(*args), want):
                bad.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not bad
