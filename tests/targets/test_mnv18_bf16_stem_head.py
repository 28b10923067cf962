"""mnv18: the bf16 stem reading the float32 image (`mbconv_bf16.c`'s stem, `MbConv(stem=...,
bf16=True)`) and the bf16 network head (`mbconv_bf16_head.c`, `MbHead(bf16=True)`), alone and in
the bf16 block chain.

The kernels against torch's float64 convolutions on the bf16-rounded values, rounded to bf16
where the program rounds (odd sizes, channel counts no multiple of 16, batch 1 and 3, 1 and 2
threads, NCHW and channels-last images, strided head inputs and outputs); networks
`quantize_bf16`'d (a stem, blocks, a head with its classifier; MobileNetV2) against ONNX
Runtime float32, no worse than the path before (the switches off), one run step, the profiled
path; the switches.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import conv_chain, native_mbchain, native_mbconv  # noqa: E402
from pygraphx.targets.torch_lowering import native_mbhead  # noqa: E402
from pygraphx.targets.torch_lowering.native_mbchain import MbChain  # noqa: E402
from pygraphx.targets.torch_lowering.native_mbconv import MbConv  # noqa: E402
from pygraphx.targets.torch_lowering.native_mbhead import MbHead  # noqa: E402
from tests.helpers import run_ort  # noqa: E402
from tests.targets.test_native_mbhead import _net  # noqa: E402


def _why() -> str | None:
    try:
        lib = native_mbconv.library()
    except native.NativeUnavailable as exc:
        return str(exc)
    return None if lib.mbconv_bf16_supported() else "the build has no AVX512_BF16"


_WHY = _why()
needs_bf16 = pytest.mark.skipif(_WHY is not None, reason=f"bf16 mbconv unavailable: {_WHY}")
CL = torch.channels_last
BF = torch.bfloat16
D = torch.float64
CLIP = ("hardtanh", [0.0, 6.0])


def _rb(t: torch.Tensor) -> torch.Tensor:
    """Rounded to bf16, as float64."""
    return t.to(BF).to(D)


def _r(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale / np.sqrt(np.prod(shape[1:]) or 1)


@pytest.fixture
def threads():  # noqa: ANN201
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


# --- the stem ---------------------------------------------------------------------------------

STEMS = [
    # n, c, ih, iw, m, k, stem stride, depthwise stride, channels-last image
    (1, 3, 17, 19, 32, 16, 2, 1, False),
    (3, 3, 13, 11, 20, 7, 2, 1, True),
    (2, 4, 9, 7, 17, 33, 1, 2, False),
    (1, 1, 10, 12, 40, 24, 2, 2, True),
    (1, 2, 23, 37, 24, 8, 2, 1, False),  # (3 C even: no zero kernel row; iw > 16: a tail)
]


@needs_bf16
@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("case", STEMS)
def test_stem_against_torch(case: tuple, nthreads: int, threads) -> None:
    """The float32 image rounded to bf16 (the program's convert), the 3x3 convolution of the
    bf16 weight, E, D and y each rounded to bf16: float64 torch on those values."""
    n, c, ih, iw, m, k, s, ds, cl = case
    threads(nthreads)
    g = torch.Generator().manual_seed(sum(case))
    x = torch.randn(n, c, ih, iw, generator=g) * 2
    if cl:
        x = x.contiguous(memory_format=CL)
    we, be = _r(g, m, c, 3, 3).to(BF), _r(g, m, scale=0.3).to(BF).float()
    wd, bd = _r(g, m, 1, 3, 3).to(BF), _r(g, m, scale=0.3)
    wp, bp = _r(g, k, m, 1, 1).to(BF), _r(g, k, scale=0.3)
    mb = MbConv(we, be, wd, bd, wp, bp, ds, [CLIP, CLIP, ("none", [])], [n, c, ih, iw], False,
                stem=s, bf16=True)  # fmt: skip
    assert mb.args.shared == 0
    got = mb(x)
    assert got.dtype == BF and got.is_contiguous(memory_format=CL)
    e = _rb(F.conv2d(_rb(x), we.to(D), be.to(D), stride=s, padding=1).clamp(0, 6))
    d = _rb(F.conv2d(e, wd.to(D), bd.to(D), stride=ds, padding=1, groups=m).clamp(0, 6))
    want = _rb(F.conv2d(d, wp.to(D), bp.to(D)))
    exact = F.conv2d(F.conv2d(F.conv2d(x.to(D), we.to(D), be.to(D), stride=s, padding=1)
                              .clamp(0, 6), wd.to(D), bd.to(D), stride=ds, padding=1, groups=m)
                     .clamp(0, 6), wp.to(D), bp.to(D))  # fmt: skip
    scale = want.abs() + 1
    assert float(((got.double() - want).abs() / scale).max()) < 1.2e-2
    assert float(((got.double() - exact).abs() / scale).max()) < 3e-2
    # each value rounded where the program rounds: the oracle's bf16 value almost everywhere
    # (a stem that skipped rounding the image or E matches far fewer)
    assert float((got == want.to(BF)).double().mean()) >= 0.98
    assert torch.equal(mb(x), got)


@needs_bf16
def test_stem_rounds_the_image() -> None:
    """An image of a value bf16 rounds up (1 + 2^-8 + 2^-10 -> 1 + 2^-7): the kernel convolves
    the rounded value (the program's convert), not the float32 one: E = 256 x - 256 is 2, not
    1.25 (exact in bf16 both)."""
    x = torch.full((1, 1, 4, 5), 1.0 + 2.0**-8 + 2.0**-10)
    we = torch.zeros(16, 1, 3, 3)
    we[:, 0, 1, 1] = 256.0  # the centre tap
    wd = torch.zeros(16, 1, 3, 3)
    wd[:, 0, 1, 1] = 1.0
    wp = torch.eye(16).reshape(16, 16, 1, 1)
    mb = MbConv(we.to(BF), torch.full((16,), -256.0), wd.to(BF), None, wp.to(BF), None, 1,
                [("none", [])] * 3, [1, 1, 4, 5], False, stem=1, bf16=True)  # fmt: skip
    for image in (x, x.contiguous(memory_format=CL)):
        assert torch.equal(mb(image).float(), torch.full((1, 16, 4, 5), 2.0))


# --- the head ---------------------------------------------------------------------------------

HEADS = [
    # n, cin, h, w, cout, ncls (0: the pooled values)
    (1, 320, 7, 7, 1280, 1000),
    (3, 17, 5, 3, 40, 33),
    (2, 33, 4, 4, 20, 0),
    (1, 16, 9, 7, 70, 17),
    (3, 8, 1, 1, 24, 5),
]


def _head_oracle(x, w, b, wc):  # noqa: ANN001, ANN202
    m = _rb(F.conv2d(x.to(D), w.to(D), b.to(D)).clamp(0, 6))
    p = _rb(m.mean(dim=(2, 3)))
    return p if wc is None else _rb(p @ wc.to(D))


@needs_bf16
@pytest.mark.parametrize("out", [torch.float32, BF])
@pytest.mark.parametrize("nthreads,chunks", [(1, None), (2, None), (2, 64)])
@pytest.mark.parametrize("case", HEADS)
def test_head_against_torch(
    case: tuple, nthreads: int, chunks: int | None, out: torch.dtype, threads,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The map, the pooled values and the classifier's result each rounded to bf16; the
    output bf16 or float32 holding the bf16 values."""
    n, cin, h, w, cout, ncls = case
    threads(nthreads)
    if chunks is not None:  # (every pixel range its own job)
        monkeypatch.setattr(native_mbhead, "JOBS_PER_THREAD", chunks)
    g = torch.Generator().manual_seed(sum(case))
    x = (torch.randn(n, cin, h, w, generator=g) * 2).to(BF).contiguous(memory_format=CL)
    wt, b = _r(g, cout, cin, 1, 1).to(BF), _r(g, cout, scale=0.3) + 1
    wc = _r(g, cout, ncls).to(BF) if ncls else None
    head = MbHead(wt, b, 0.0, 6.0, wc, None, [n, cin, h, w], bf16=True, out_dtype=out)
    got = head(x)
    want = _head_oracle(x, wt, b, wc)
    assert got.dtype == out and list(got.shape) == ([n, ncls] if ncls else [n, cout, 1, 1])
    got = got.double().reshape(want.shape)
    # the pooled sum's order differs from torch's: a bf16 ulp at a few places
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)
    assert float((got == want).double().mean()) >= 0.97
    assert torch.equal(head(x).double().reshape(want.shape), got)


@needs_bf16
def test_head_strided_input_and_pooled_output(threads) -> None:
    """An NCHW (not channels-last) input is copied; a pooled output written through its
    strides (a column of a wider tensor)."""
    threads(2)
    g = torch.Generator().manual_seed(5)
    n, cin, h, w, cout = 2, 24, 5, 6, 40
    x = (torch.randn(n, cin, h, w, generator=g)).to(BF)
    wt, b = _r(g, cout, cin, 1, 1).to(BF), _r(g, cout, scale=0.3) + 1
    head = MbHead(wt, b, 0.0, 6.0, None, None, [n, cin, h, w], bf16=True)
    wide = torch.zeros(n, 2 * cout, 1, 1, dtype=BF)
    y = wide[:, ::2]
    got = head(x, y)
    assert got is y and torch.equal(wide[:, 1::2], torch.zeros_like(wide[:, 1::2]))
    torch.testing.assert_close(y.double(), _head_oracle(x, wt, b, None).reshape(y.shape),
                               rtol=1.6e-2, atol=1e-2)  # fmt: skip


@needs_bf16
def test_head_refusals() -> None:
    wt = torch.randn(16, 8, 1, 1).to(BF)
    with pytest.raises(ValueError, match="no classifier bias"):
        MbHead(wt, None, 0.0, 6.0, torch.randn(16, 5).to(BF), torch.randn(5), [1, 8, 3, 3],
               bf16=True)  # fmt: skip
    head = MbHead(wt, None, 0.0, 6.0, torch.randn(16, 5).to(BF), None, [1, 8, 3, 3], bf16=True,
                  out_dtype=torch.float32)  # fmt: skip
    with pytest.raises(ValueError, match="input must be a bfloat16"):
        head(torch.randn(1, 8, 3, 3))
    with pytest.raises(ValueError, match="output must be a float32"):
        head(torch.randn(1, 8, 3, 3).to(BF), torch.empty(1, 5, dtype=BF))


# --- networks ---------------------------------------------------------------------------------


def _compile_bf16(model, nthreads: int, output: str = "arena"):  # noqa: ANN001, ANN202
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog, ["all"])
    prog.compile(CpuTarget(threads=nthreads, conv_output=output))
    return prog


def _convert_in_stem(prog) -> bool:  # noqa: ANN001
    """Whether the program's first step computes the image's convert with the stem's block
    (the convert no step of its own)."""
    names = [i.op.name for i in prog._executable.lowered.steps[0].instructions]
    return names[0] == "pointwise" and "convolution" in names


def _old_route(mp: pytest.MonkeyPatch) -> None:
    mp.setenv(native_mbconv.STEM_BF16_ENV, "0")
    mp.setenv(native_mbhead.BF16_ENV, "0")


@needs_bf16
@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("output", ["arena", "torch"])
@pytest.mark.parametrize("n,h", [(1, 23), (3, 17)])
def test_network_against_ort(n: int, h: int, output: str, nthreads: int,
                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A stem (stride 2), two blocks and a head with a classifier (no bias), `quantize_bf16`'d:
    the stem (reading the float32 image) and the first block one native block, the head native
    (its input convert and the classifier's convert to float32 in their steps), at batch 1 the
    whole program one chain; against ORT float32 within bf16's error and no worse than the path
    before (the switches off); twice; the profiled path (the unfused twins)."""
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    model, feeds = _net(n, h, bias=False)
    want = run_ort(model, feeds)[0]
    prog = _compile_bf16(model, nthreads, output)
    cache = prog._executable.lowered.ctx.cache
    assert cache.get("native_mbhead", 0) == 1 and cache.get("native_mbconv", 0) == 2
    assert _convert_in_stem(prog)  # (the stem converts as it reads)
    chains = prog._executable.chained.chains
    if output == "arena":
        assert len(chains) == 1 and isinstance(chains[0], MbChain) and chains[0].head is not None
    with pytest.MonkeyPatch.context() as mp:
        _old_route(mp)
        old = _compile_bf16(model, nthreads, output)
    old_cache = old._executable.lowered.ctx.cache
    assert old_cache.get("native_mbhead", 0) == 0 and old_cache.get("input_convert", 0) == 1
    assert not _convert_in_stem(old)
    scale = float(np.abs(want).max())
    err_old = float(np.abs(old.run(feeds)[0] - want).max()) / scale
    for _ in range(2):
        got = np.asarray(prog.run(feeds)[0])
        assert got.dtype == np.float32
        err = float(np.abs(got - want).max()) / scale
        assert err < 3e-2 and err <= 1.25 * err_old + 2e-3, (err, err_old)
    profiled = prog.run(feeds, observer=lambda ins, v, s: None)[0]
    assert float(np.abs(profiled - want).max()) / scale < 3e-2


@needs_bf16
def test_head_alone_and_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    """`native_mbchain.BF16_HEAD = False`: the bf16 head its own step (same values as in the
    chain); `PGX_CPU_NATIVE_MBSTEM_BF16=0`: the input convert its own step, the stem on
    oneDNN; `PGX_CPU_NATIVE_MBHEAD_BF16=0`: no native head."""
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    model, feeds = _net(1, 19, bias=False)
    chained = _compile_bf16(model, 2)
    monkeypatch.setattr(native_mbchain, "BF16_HEAD", False)
    alone = _compile_bf16(model, 2)
    assert [type(c).__name__ if c else None for c in alone._executable.chained.chains] == [
        "MbChain", None]
    assert np.array_equal(chained.run(feeds)[0], alone.run(feeds)[0])
    monkeypatch.setattr(native_mbchain, "BF16_HEAD", True)
    monkeypatch.setenv(native_mbconv.STEM_BF16_ENV, "0")
    nostem = _compile_bf16(model, 2)
    cache = nostem._executable.lowered.ctx.cache
    assert not _convert_in_stem(nostem) and cache.get("native_mbconv", 0) == 2
    assert cache.get("native_mbhead", 0) == 1
    monkeypatch.delenv(native_mbconv.STEM_BF16_ENV)
    monkeypatch.setenv(native_mbhead.BF16_ENV, "0")
    nohead = _compile_bf16(model, 2)
    cache = nohead._executable.lowered.ctx.cache
    assert _convert_in_stem(nohead) and cache.get("native_mbhead", 0) == 0
    assert conv_chain.HEAD_IN_CHAIN is True


@needs_bf16
@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3])
def test_mobilenetv2_against_ort(batch: int, nthreads: int,
                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """MobileNetV2 `quantize_bf16`'d: the stem, 17 blocks and the head native (at batch 1 one
    run step), against ORT float32 within bf16's error and no worse than the path before (the
    switches off) by more than a tenth."""
    from pygraphx.models import get_model, model_inputs

    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    model = get_model("mobilenetv2", batch=batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs("mobilenetv2", model).items()}
    want = run_ort(model, feeds)[0]
    scale = float(np.abs(want).max())

    def compile_() -> pygraphx.Program:  # (the model's own bf16 policy, as the benchmarks)
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=nthreads))
        return prog

    new = compile_()
    cache = new._executable.lowered.ctx.cache
    assert cache.get("native_mbconv", 0) == 17 and cache.get("native_mbhead", 0) == 1
    if batch == 1:
        assert len(new._executable.executor.steps) == 1
    with pytest.MonkeyPatch.context() as mp:
        _old_route(mp)
        old = compile_()

    def rel(prog: pygraphx.Program) -> tuple[float, float]:
        got = np.asarray(prog.run(feeds)[0], dtype=np.float64)
        return (float(np.abs(got - want).max()) / scale,
                float(np.linalg.norm(got - want) / np.linalg.norm(want)))  # fmt: skip

    (new_max, new_rms), (old_max, old_rms) = rel(new), rel(old)
    assert new_max < 6e-2 and new_max <= 1.1 * old_max, (new_max, old_max)
    assert new_rms <= 1.1 * old_rms, (new_rms, old_rms)


@needs_bf16
@pytest.mark.parametrize("nthreads", [1, 2])
def test_classifier_bias_its_own_step(nthreads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A classifier with a bias (an ONNX Gemm's C): the bf16 head ends at the `dot` (its bf16
    result), the bias group (and the convert to float32) a step after it; against ORT."""
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    model, feeds = _net(3, 17, bias=True)
    want = run_ort(model, feeds)[0]
    prog = _compile_bf16(model, nthreads)
    steps = [[i.op.name for i in s.instructions] for s in prog._executable.lowered.steps]
    assert steps[-2][-3:] == ["pooling", "flatten", "dot"] and steps[-1] == ["pointwise"]
    assert prog._executable.lowered.ctx.cache.get("native_mbhead", 0) == 1
    with pytest.MonkeyPatch.context() as mp:
        _old_route(mp)
        old = _compile_bf16(model, nthreads)
    scale = float(np.abs(want).max())
    err = float(np.abs(np.asarray(prog.run(feeds)[0]) - want).max()) / scale
    err_old = float(np.abs(np.asarray(old.run(feeds)[0]) - want).max()) / scale
    assert err < 3e-2 and err <= 1.25 * err_old + 2e-3, (err, err_old)
