"""The native kernels' packed weights under a float64 default dtype (helper tidy17b).

`torch.set_default_dtype(torch.float64)` in the caller's process used to make the packed weights
and biases of `native_mbconv` (`pack_1x1`, `pad_vector`, `pack_dw`; the head's too, through
them) and `winograd_native.pack_weight` float64 tensors, which the float32 kernels then read as
float32: garbage results. Here a MobileNet-style network (stem, blocks, head) and a Winograd
layer are compiled and run under a float64 default and compared with ONNX Runtime / torch's
float64 convolution; the default is restored after each test (a fixture).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import (  # noqa: E402
    native_mbconv,
    native_mbhead,
    winograd,
    winograd_native,
)
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan  # noqa: E402
from tests.helpers import run_ort  # noqa: E402
from tests.targets import test_native_mbconv as mbconv_tests  # noqa: E402
from tests.targets import test_native_mbhead as mbhead_tests  # noqa: E402


def _why(library) -> str | None:  # noqa: ANN001
    try:
        library()
    except native.NativeUnavailable as exc:
        return str(exc)
    return None


_MB = _why(native_mbconv.library)
_WINO = _why(winograd_native.library)
needs_mbconv = pytest.mark.skipif(_MB is not None, reason=f"native mbconv unavailable: {_MB}")
needs_wino = pytest.mark.skipif(_WINO is not None, reason=f"native winograd unavailable: {_WINO}")


@pytest.fixture
def float64_default():  # noqa: ANN201
    """A float64 default dtype for the test, the one before restored after it."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def test_packers_make_float32(float64_default) -> None:  # noqa: ANN001
    """Every packer gives float32 (bf16 for the bf16 one) whatever the default dtype, and the
    values of its float32 input."""
    assert torch.get_default_dtype() == torch.float64
    w = torch.randn(20, 7, 1, 1, dtype=torch.float32)
    packed = native_mbconv.pack_1x1(w)
    assert packed.dtype == torch.float32
    block = packed.view(7, 32)  # (N padded to 32: one block of 64 channels, (K, 32))
    assert torch.equal(block[:, :20], w.view(20, 7).t()) and not block[:, 20:].any()
    assert native_mbconv.pack_1x1(w, pad_k=True).dtype == torch.float32
    assert native_mbconv.pack_1x1_bf16(w).dtype == torch.bfloat16
    b = torch.randn(5, dtype=torch.float32)
    padded = native_mbconv.pad_vector(b, 5)
    assert padded.dtype == torch.float32 and torch.equal(padded[:5], b)
    assert native_mbconv.pad_vector(None, 5).dtype == torch.float32
    wd = torch.randn(5, 1, 3, 3, dtype=torch.float32)
    dw = native_mbconv.pack_dw(wd)
    assert dw.dtype == torch.float32 and torch.equal(dw[:, :5], wd.view(5, 9).t())
    wt = torch.randn(36, 4, 5, dtype=torch.float32)
    assert winograd_native.pack_weight(wt).dtype == torch.float32
    # a float64 transformed weight (winograd.weight_transform under this default) too
    assert winograd_native.pack_weight(wt.double()).dtype == torch.float32


@needs_mbconv
@pytest.mark.parametrize("stem", ["0", "1"])
def test_blocks_against_ort(
    stem: str, float64_default, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """`test_native_mbconv`'s five-block network, every block on the kernel, compiled and run
    under a float64 default: ONNX Runtime's result."""
    monkeypatch.setenv(native_mbconv.STEM_ENV, stem)
    model, feeds = mbconv_tests._net(1, 17, mbconv_tests.NET)
    want = run_ort(model, feeds)[0]
    prog = mbconv_tests._compile(model, "all", monkeypatch, 1)
    for _ in range(2):
        np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    assert prog._executable.lowered.ctx.cache.get("native_mbconv", 0) == len(mbconv_tests.NET)


@needs_mbconv
@pytest.mark.parametrize("nthreads", [1, 2])
def test_stem_blocks_and_head_against_ort(
    nthreads: int, float64_default, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """`test_native_mbhead`'s network (a stem that is the first block's expansion, a block, the
    head with its classifier and bias) under a float64 default: ONNX Runtime's result, the head
    on the kernel."""
    monkeypatch.delenv(native_mbhead.ENV, raising=False)
    monkeypatch.delenv(native_mbconv.STEM_ENV, raising=False)
    model, feeds = mbhead_tests._net(1, 23)
    want = run_ort(model, feeds)[0]
    prog = mbhead_tests._compile(model, nthreads)
    for _ in range(2):
        np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    lowered = prog._executable.lowered
    assert lowered.ctx.cache.get("native_mbhead", 0) == 1
    assert lowered.ctx.cache.get("native_mbconv", 0) == 2


@needs_wino
@pytest.mark.parametrize("threads", [1, 2])
def test_winograd_layer_against_float64_conv(
    threads: int, float64_default, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """A float32 F(4,3) layer on the native kernel built under a float64 default: torch's
    float64 convolution (bias, relu), within F(4,3)'s rounding."""
    monkeypatch.delenv(winograd_native.NATIVE_ENV, raising=False)
    monkeypatch.delenv(native.NATIVE_ENV, raising=False)
    made = []
    real = winograd_native.NativeWinograd

    def spy(*args: object, **kwargs: object) -> object:
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(winograd_native, "NativeWinograd", spy)
    gen = torch.Generator().manual_seed(3)
    n, c, h, k = 2, 24, 13, 40
    weight = torch.randn(k, c, 3, 3, generator=gen, dtype=torch.float32) / (3 * c**0.5)
    bias = torch.randn(k, generator=gen, dtype=torch.float32)
    plan = ConvPlan(weight, weight, [n, c, h, h], [1, 1], [1, 1], [1, 1], 1, None, bias=bias,
                    unary="relu")  # fmt: skip
    x = torch.randn(n, c, h, h, generator=gen, dtype=torch.float32)
    x = x.contiguous(memory_format=torch.channels_last)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = winograd.build(plan, lambda: x, None, 4, None)()
    finally:
        torch.set_num_threads(old)
    assert len(made) == 1
    assert y.dtype == torch.float32
    ref = F.conv2d(x.double(), weight.double(), bias.double(), padding=1).relu()
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    assert err < 3e-5, f"relative error {err:.2e}"


def test_encoder_layernorm_and_gelu_against_ort(
    float64_default, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """A transformer encoder layer's heavy parts (`test_bf16_cpu.encoder_model`: MatMul + bias
    + GELU, MatMul + residual, LayerNormalization, scores) compiled and run under a float64
    default: ONNX Runtime's results, the norm and the GELU on their native kernels where the
    build has them (`native_layernorm.LayerNorm`, `native_gelu.PASSES`). Their modules name
    every tensor's dtype already (tidy17b found nothing to change there, nor in
    `native_attention`, which this model's float32 attention does not reach)."""
    from pygraphx.targets.torch_lowering import native_gelu, native_layernorm
    from tests.quantize.test_bf16_cpu import encoder_model

    made = {"norm": 0, "gelu": 0}

    def spy(cls: type, key: str) -> type:
        class Spy(cls):  # type: ignore[misc, valid-type]
            def __init__(self, *args: object, **kwargs: object) -> None:
                made[key] += 1
                super().__init__(*args, **kwargs)

        return Spy

    monkeypatch.setattr(native_layernorm, "LayerNorm", spy(native_layernorm.LayerNorm, "norm"))
    for act, cls in list(native_gelu.PASSES.items()):
        monkeypatch.setitem(native_gelu.PASSES, act, spy(cls, "gelu"))
    model, feeds = encoder_model()
    want = run_ort(model, feeds)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    for _ in range(2):
        got = prog.run(feeds)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)
    if native_layernorm.available(False):
        assert made["norm"] >= 1
    if native_gelu.available("gelu"):
        assert made["gelu"] >= 1


@needs_mbconv
@pytest.mark.slow  # builds MobileNetV2 and runs it on ONNX Runtime and the cpu target (~3 s)
def test_mobilenetv2_b1_against_ort(float64_default) -> None:  # noqa: ANN001
    """MobileNetV2 at batch 1 (random weights) compiled and run under a float64 default: ONNX
    Runtime's result, its 17 blocks and its head on the native kernels."""
    from pygraphx.models import get_model, model_inputs

    torch.set_default_dtype(torch.float32)  # (the model is built as usual ...)
    model = get_model("mobilenetv2", batch=1)
    feeds = model_inputs("mobilenetv2", model)
    want = run_ort(model, feeds)[0]
    torch.set_default_dtype(torch.float64)  # (... and compiled and run under float64)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    np.testing.assert_allclose(np.asarray(prog.run(feeds)[0]), want, rtol=1e-4, atol=1e-4)
    lowered = prog._executable.lowered
    assert lowered.ctx.cache.get("native_mbconv", 0) == 17
    assert lowered.ctx.cache.get("native_mbhead", 0) == 1


@needs_wino
def test_torch_winograd_route_under_float64_default(
    float64_default, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """The same layer on the torch route (`PGX_WINOGRAD_NATIVE=0`: its scratch, transformed
    weight and warm-up tensors are float32 under a float64 default; it raised "expected scalar
    type Double but found Float" before): torch's float64 convolution, within F(4,3)'s rounding."""
    monkeypatch.setenv(winograd_native.NATIVE_ENV, "0")
    gen = torch.Generator().manual_seed(4)
    n, c, h, k = 2, 24, 13, 40
    weight = torch.randn(k, c, 3, 3, generator=gen, dtype=torch.float32) / (3 * c**0.5)
    bias = torch.randn(k, generator=gen, dtype=torch.float32)
    plan = ConvPlan(weight, weight, [n, c, h, h], [1, 1], [1, 1], [1, 1], 1, None, bias=bias,
                    unary="relu")  # fmt: skip
    x = torch.randn(n, c, h, h, generator=gen, dtype=torch.float32)
    x = x.contiguous(memory_format=torch.channels_last)
    y = winograd.build(plan, lambda: x, None, 4, None)()
    assert y.dtype == torch.float32
    ref = F.conv2d(x.double(), weight.double(), bias.double(), padding=1).relu()
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    assert err < 3e-5, f"relative error {err:.2e}"
