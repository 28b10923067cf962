"""The bf16 inverted-residual block (`native/kernels/mbconv_bf16.c`, `native_mbconv.MbConv(...,
bf16=True)`, helper bfmb16).

The kernel against torch's float64 `F.conv2d` chain on the bf16-rounded input, residual and
weights, rounded to bf16 after each convolution as the oneDNN route does (odd channel counts,
strides 1 and 2, with and without the residual and the expansion, batch 1 and 3, 1 and 2
threads, rows or the shared image); a network of blocks `quantize_bf16`'d against ONNX Runtime
float32 with the blocks on the kernel, no worse than the oneDNN route; the switch.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import native_mbconv  # noqa: E402
from pygraphx.targets.torch_lowering.native_mbconv import MbConv  # noqa: E402
from tests.helpers import run_ort  # noqa: E402
from tests.targets.test_native_mbconv import _net  # noqa: E402


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
CLIP = ("hardtanh", [0.0, 6.0])


def _bf(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.to(BF)


def _oracle(  # noqa: ANN202
    x: torch.Tensor, w: dict, stride: int, residual: torch.Tensor | None, round_: bool
):
    """float64; `round_`: each convolution's output rounded to bf16 (the oneDNN route's)."""
    d = torch.float64

    def rb(t: torch.Tensor) -> torch.Tensor:
        return t.to(BF).to(d) if round_ else t

    e = x.to(d)
    if w["we"] is not None:
        e = rb(F.conv2d(e, w["we"].to(d), w["be"].to(d)).clamp(0, 6))
    m = w["wd"].shape[0]
    e = rb(F.conv2d(e, w["wd"].to(d), w["bd"].to(d), stride, 1, 1, m).clamp(0, 6))
    y = F.conv2d(e, w["wp"].to(d), w["bp"].to(d))
    if residual is not None:
        y = y + residual.to(d)
    return rb(y)


CASES = [
    # n, c, h, w, m, k, stride, residual, expand
    (1, 7, 9, 11, 21, 13, 1, False, True),
    (3, 16, 10, 8, 48, 16, 1, True, True),
    (1, 24, 12, 12, 144, 24, 2, False, True),
    (3, 9, 13, 6, 33, 9, 2, False, True),
    (1, 17, 9, 7, 51, 17, 1, True, True),
    (2, 160, 7, 7, 960, 40, 1, False, True),
    (3, 17, 9, 7, 17, 17, 1, True, False),  # no expansion (x widened)
    (1, 17, 10, 9, 17, 9, 2, False, False),
    (1, 8, 1, 1, 24, 8, 1, True, True),
]


@needs_bf16
@pytest.mark.parametrize("threads,shared", [(1, None), (2, False), (2, True)])
@pytest.mark.parametrize("case", CASES)
def test_kernel_against_torch(
    case: tuple, threads: int, shared: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, c, h, w, m, k, stride, residual, expand = case
    monkeypatch.setattr(native_mbconv, "SHARED", shared)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(sum(case))

        def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return torch.randn(*shape, generator=g) * scale / np.sqrt(np.prod(shape[1:]) or 1)

        wts = {
            "we": _bf(r(m, c, 1, 1)) if expand else None,
            "be": _bf(r(m, scale=0.3)).float() if expand else None,  # (a bf16 layer's bias)
            "wd": _bf(r(m, 1, 3, 3)), "bd": r(m, scale=0.3),  # (a float32 one: kept wide)
            "wp": _bf(r(k, m, 1, 1)), "bp": r(k, scale=0.3),
        }  # fmt: skip
        x = (torch.randn(n, c, h, w, generator=g) * 2).to(BF).contiguous(memory_format=CL)
        ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
        res = None
        if residual:
            res = torch.randn(n, k, ho, wo, generator=g).to(BF).contiguous(memory_format=CL)
        acts = [CLIP, CLIP, ("none", [])]
        mb = MbConv(*wts.values(), stride, acts, [n, c, h, w], residual, bf16=True)
        assert mb.args.shared == int(bool(shared))
        got = mb(x, other=res)
        assert got.dtype == BF and got.is_contiguous(memory_format=CL)
        ref = {} if expand else {"be": torch.zeros(m)}
        want = _oracle(x, {**wts, **ref}, stride, res, round_=True)
        exact = _oracle(x, {**wts, **ref}, stride, res, round_=False)
        scale = want.abs() + 1
        # one bf16 rounding of y (2^-9 relative) and, rarely, an ulp of a rounded E or D
        assert float(((got.double() - want).abs() / scale).max()) < 1.2e-2
        assert float(((got.double() - exact).abs() / scale).max()) < 3e-2
        # the rounding order itself: E, D and y rounded once each gives the oracle's bf16 value
        # bit for bit almost everywhere (99.87-100 % in review16c's runs; a kernel that skips
        # the rounding of E or of D matches 25-49 %), the rest a few ulps near zero
        assert float((got == want.to(BF)).double().mean()) >= 0.99
        assert torch.equal(got, mb(x, other=res))  # a second call: the same values
    finally:
        torch.set_num_threads(before)


@needs_bf16
def test_refuses_float32_and_a_bf16_image() -> None:
    """A bf16 block reads bf16; a bf16 stem (mnv18: `tests/targets/test_mnv18_bf16_stem_head.py`)
    reads the float32 image, never a bf16 one."""
    w = {"we": torch.randn(8, 4, 1, 1).to(BF), "be": None, "wd": torch.randn(8, 1, 3, 3).to(BF),
         "bd": None, "wp": torch.randn(4, 8, 1, 1).to(BF), "bp": None}  # fmt: skip
    mb = MbConv(*w.values(), 1, [CLIP, CLIP, ("none", [])], [1, 4, 5, 5], False, bf16=True)
    with pytest.raises(ValueError, match="bfloat16"):
        mb(torch.randn(1, 4, 5, 5).contiguous(memory_format=CL))
    w["we"] = torch.randn(8, 3, 3, 3)
    stem = MbConv(*w.values(), 1, [CLIP, CLIP, ("none", [])], [1, 3, 10, 10], False, stem=2,
                  bf16=True)  # fmt: skip
    with pytest.raises(ValueError, match="float32"):
        stem(torch.randn(1, 3, 10, 10).to(BF))


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native_mbconv.BF16_ENV, raising=False)
    assert native_mbconv.bf16_enabled() == native_mbconv.BF16_DEFAULT
    monkeypatch.setenv(native_mbconv.BF16_ENV, "0")
    assert not native_mbconv.bf16_enabled() and not native_mbconv.bf16_available()
    monkeypatch.setenv(native_mbconv.BF16_ENV, "1")
    assert native_mbconv.bf16_enabled()
    # the bf16 rule (bfmnv17): 1 and 2 threads, there every block (7x7 outputs, no expansion)
    monkeypatch.delenv(native_mbconv.BF16_ALL_ENV, raising=False)
    assert native_mbconv.BF16_THREADS == (1, 2)
    assert native_mbconv.bf16_rule(14, 14, 1, True, 1)
    assert native_mbconv.bf16_rule(56, 56, 1, False, 1)
    assert not native_mbconv.bf16_rule(14, 14, 1, True, 4)
    assert native_mbconv.bf16_rule(14, 14, 2, True, 2)
    assert native_mbconv.bf16_rule(14, 14, 1, True, 2)
    assert native_mbconv.bf16_rule(56, 56, 1, False, 2)
    assert native_mbconv.bf16_rule(2, 2, 2, False, 2)
    # bfmb16's rule (`PGX_CPU_NATIVE_MBCONV_BF16_ALL=0`): no 7x7 output above 1 thread, no
    # block without expansion
    monkeypatch.setenv(native_mbconv.BF16_ALL_ENV, "0")
    assert native_mbconv.BF16_RULE16[0] == (2,)
    assert not native_mbconv.bf16_rule(14, 14, 1, True, 1)
    assert not native_mbconv.bf16_rule(14, 14, 2, True, 2)
    assert native_mbconv.bf16_rule(14, 14, 1, True, 2)
    assert native_mbconv.bf16_rule(16, 16, 2, True, 2)
    assert not native_mbconv.bf16_rule(56, 56, 1, False, 2)
    monkeypatch.setattr(native_mbconv, "BF16_RULE16", ((1, 2), False, 49))
    assert native_mbconv.bf16_rule(14, 14, 2, True, 1)


NET = [(16, 16, 8, 1), (8, 48, 8, 1), (8, 48, 8, 1), (8, 48, 12, 2), (12, 72, 12, 1)]


def _compile(model, threads: int, on: str, output: str):  # noqa: ANN001, ANN202
    """(the bf16 stem and head, mnv18, off: these tests count the blocks of bfmb16's rules;
    `tests/targets/test_mnv18_bf16_stem_head.py` tests them)"""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(native_mbconv.BF16_ENV, on)
        mp.setenv(native_mbconv.STEM_BF16_ENV, "0")
        mp.setenv("PGX_CPU_LOAD_ADAPT", "0")  # (a loaded machine would lower at 1 thread)
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=threads, conv_output=output))
    return prog


@needs_bf16
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("output", ["arena", "torch"])
@pytest.mark.parametrize("n,h", [(1, 17), (3, 12)])
@pytest.mark.parametrize("every", ["1", "0"])
def test_network_against_ort(
    n: int, h: int, output: str, threads: int, every: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five blocks `quantize_bf16`'d: the last's sum converted to float32 for the float32
    convolution after it (the policy keeps the last layer float32: a group the kernel does not
    write, the oneDNN route), the other four on the kernel (at 1 and 2 threads); with bfmb16's
    rule (its 2 threads patched to 1 and 2) (`every` "0": `PGX_CPU_NATIVE_MBCONV_BF16_ALL=0`) the first,
    without expansion, and at 2 threads a 6x6 output on the oneDNN route;
    against ORT float32 no worse than the
    oneDNN route (the switch off) and within bf16's error; twice; the profiled path."""
    monkeypatch.setattr(native_mbconv, "BF16_RULE16", ((1, 2), False, 49))  # (its default: 2)
    monkeypatch.setenv(native_mbconv.BF16_ALL_ENV, every)
    model, feeds = _net(n, h, NET, seed=3)
    want = run_ort(model, feeds)[0]
    on, off = _compile(model, threads, "1", output), _compile(model, threads, "0", output)
    # (bfmb16's rule, 12 x 12, 2 threads: the stride-2 block's 6 x 6 output keeps the oneDNN
    # route)
    taken = len(NET) - 1 if every == "1" else len(NET) - 2 - (threads == 2 and h == 12)
    assert on._executable.lowered.ctx.cache.get("native_mbconv", 0) == taken
    assert off._executable.lowered.ctx.cache.get("native_mbconv", 0) == 0
    scale = float(np.abs(want).max())
    err_off = float(np.abs(off.run(feeds)[0] - want).max()) / scale
    for _ in range(2):
        got = on.run(feeds)[0]
        err = float(np.abs(got - want).max()) / scale
        assert err < 3e-2 and err <= 1.25 * err_off + 1e-3, (err, err_off)
    profiled = on.run(feeds, observer=lambda ins, v, s: None)[0]
    assert float(np.abs(profiled - want).max()) / scale < 3e-2


@needs_bf16
def test_rule_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch on: at 1 and 2 threads the bf16 blocks take the kernel (bfmnv17), with
    `PGX_CPU_NATIVE_MBCONV_BF16_ALL=0` (bfmb16's rule) at 1 thread none (the oneDNN route), at
    2 those with an expansion; the switch unset: `BF16_DEFAULT` (on); off: none."""
    model, _ = _net(1, 17, NET, seed=3)
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")  # (a loaded machine would lower at 1 thread)
    monkeypatch.setenv(native_mbconv.STEM_BF16_ENV, "0")  # (mnv18's stem: counted elsewhere)
    assert native_mbconv.BF16_DEFAULT is True
    cases = (("1", "1", 1, len(NET) - 1), ("1", "1", 2, len(NET) - 1),
             (None, None, 2, len(NET) - 1), ("0", "1", 2, 0), ("0", "1", 1, 0),
             ("1", "0", 1, 0), ("1", "0", 2, len(NET) - 2))  # fmt: skip
    for env, every, threads, want in cases:
        for name, value in ((native_mbconv.BF16_ENV, env), (native_mbconv.BF16_ALL_ENV, every)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=threads))
        got = prog._executable.lowered.ctx.cache.get("native_mbconv", 0)
        assert got == want, (env, every, threads)


@needs_bf16
@pytest.mark.parametrize("threads", [1, 2])
def test_mobilenetv2_against_ort(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """MobileNetV2 `quantize_bf16`'d at 1 and 2 threads: its 17 blocks on the kernel (bfmb16's
    rule, `PGX_CPU_NATIVE_MBCONV_BF16_ALL=0`: at 2 threads the 12 with an expansion and an
    output larger than 7x7, at 1 none), the relative error against ORT float32 within bf16's and no worse than the oneDNN
    route's by more than a tenth."""
    from pygraphx.models import get_model, model_inputs

    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    model = get_model("mobilenetv2", batch=1)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs("mobilenetv2", model).items()}
    want = run_ort(model, feeds)[0]
    scale = float(np.abs(want).max())
    errs = {}
    for on, every, blocks in (("1", "1", 17), ("1", "0", 12 if threads == 2 else 0),
                              ("0", "1", 0)):  # fmt: skip
        monkeypatch.setenv(native_mbconv.BF16_ALL_ENV, every)
        prog = _compile(model, threads, on, "arena")
        taken = prog._executable.lowered.ctx.cache.get("native_mbconv", 0)
        assert taken == blocks
        errs[on + every] = float(np.abs(prog.run(feeds)[0] - want).max()) / scale
    for key in ("11", "10"):  # (the maximum |error| over the largest |output|)
        assert errs[key] < 6e-2 and errs[key] <= 1.1 * errs["01"], errs


def test_a_build_without_avx512_bf16_keeps_the_float32_blocks(monkeypatch, caplog) -> None:
    """A processor with AVX-512F but no AVX512_BF16 (Skylake-SP to Ice Lake) builds the library
    without the bf16 part's kernel: it binds, float32 blocks take the kernel, bf16 blocks the
    oneDNN route, said once (review16c: the bind asked for a bf16-only symbol and every compile
    reaching a block failed)."""
    import logging

    from pygraphx.targets.native import compiler as native_compiler

    if not native_mbconv.available():
        pytest.skip("no native mbconv kernel here (no compiler or no AVX-512F)")
    bound = native.BoundLibrary(
        native_mbconv.KERNEL, native_mbconv._bind, extra_flags=("-mno-avx512bf16",),
        parts=native_mbconv.PARTS,
    )  # fmt: skip
    monkeypatch.setattr(native_mbconv, "_BOUND", bound)
    assert native_mbconv.available() and not bound.get().mbconv_bf16_supported()
    monkeypatch.setattr(native_compiler, "_ANNOUNCED", set())  # (said once per process)
    with caplog.at_level(logging.WARNING, logger="pygraphx.cpu"):
        assert not native_mbconv.bf16_available()
    assert "no AVX512_BF16" in caplog.text
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    model, feeds = _net(1, 10, [(8, 24, 8, 1)])
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    assert prog._executable.lowered.ctx.cache.get("native_mbconv", 0) == 1
    got = np.asarray(prog.run(feeds)[0])
    want = run_ort(model, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
