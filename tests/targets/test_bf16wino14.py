"""F(4x4, 3x3) on bf16 activations (helper bf16wino14): the native kernel
(`native/kernels/winograd_f43.c`) reads bf16 input (and add operand), widens it inside the input
transform, computes in float32 and rounds the result to bf16 once as it stores it.

Oracle: torch's `F.conv2d` in float64 on the same bf16 values (weight, bias, input, operand),
the epilogue in float64. Bound per element: one bf16 rounding of the exact value (2^-8 of it:
a rounding near a tie may go either way after F(4,3)'s float32 error) plus 3e-5 of the largest
output (F(4,3)'s float32 rounding, as `test_native_winograd.py`); and at least 97 % of the
elements equal to the exact value rounded to bf16. A wrong tile, tap, channel or epilogue is
off by far more. Skipped (with the reason) where the kernel or its bf16 build cannot be had.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.torch_lowering import (  # noqa: E402
    conv_choice,
    winograd,
    winograd_native,
    winograd_rule,
)
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan, kernels_for  # noqa: E402

CL = torch.channels_last
BF = torch.bfloat16


def _why() -> str | None:
    try:
        lib = winograd_native.library()
    except native.NativeUnavailable as exc:
        return str(exc)
    if not lib.wino_f43_bf16_supported():
        return "the native kernel's build has no bf16 (AVX-512 BF16, BW, VL)"
    return None


_WHY = _why()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"native bf16 Winograd: {_WHY}")


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (winograd_native.NATIVE_ENV, winograd_native.BF16_ENV, native.NATIVE_ENV,
                 winograd_native.SILU_ENV):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def _reference(plan: ConvPlan, x: torch.Tensor, other: torch.Tensor | None) -> torch.Tensor:
    bias = None if plan.bias is None else plan.bias.double()
    y = F.conv2d(x.double(), plan.weight.double(), bias, 1, plan.padding)
    if other is not None and not plan.add_after:
        y = y + other.double()
    if plan.unary == "relu":
        y = y.relu()
    elif plan.unary == "hardtanh":
        y = y.clamp(*plan.scalars)
    elif plan.unary == "swish":
        y = F.silu(y)
    if other is not None and plan.add_after:
        y = y + other.double()
    return y


def _check(y: torch.Tensor, ref: torch.Tensor) -> None:
    assert y.dtype == BF and y.shape == ref.shape and y.is_contiguous(memory_format=CL)
    yd = y.double()
    bound = 2.0**-8 * ref.abs() + 3e-5 * ref.abs().max()
    worst = ((yd - ref).abs() - bound).max().item()
    assert worst <= 0, f"an element off by {worst:.2e} more than one bf16 rounding"
    same = (yd == ref.to(BF).double()).double().mean().item()
    assert same >= 0.97, f"only {same:.1%} of the elements are the exact value rounded"


def _plan(n, c, h, w, k, pad, gen, bias_dtype=torch.float32, **fields) -> ConvPlan:  # noqa: ANN001
    weight = (torch.randn(k, c, 3, 3, generator=gen) / (3 * c**0.5)).to(BF)
    fields.setdefault("bias", torch.randn(k, generator=gen).to(bias_dtype))
    return ConvPlan(weight, weight, [n, c, h, w], [pad, pad], [1, 1], [1, 1], 1, None,
                    **fields)  # fmt: skip


def _run(n, c, h, w, k, pad=1, threads=1, add=False, strided=False, slot=False,
         bias_dtype=torch.float32, **fields) -> None:  # fmt: skip
    gen = torch.Generator().manual_seed(n * 1000 + c * 10 + h + k)
    plan = _plan(n, c, h, w, k, pad, gen, bias_dtype, **fields)
    if strided:  # a channels-last view with gaps between pixels and rows
        big = torch.randn(n, h + 3, 2 * w + 1, c + 5, generator=gen).to(BF)
        x = big[:, 1 : 1 + h, 1::2, 2 : 2 + c].permute(0, 3, 1, 2)
        assert x.stride(1) == 1 and not x.is_contiguous(memory_format=CL)
    else:
        x = torch.randn(n, c, h, w, generator=gen).to(BF).contiguous(memory_format=CL)
    ho, wo = h + 2 * pad - 2, w + 2 * pad - 2
    other = None
    if add:
        other = torch.randn(n, k, ho, wo, generator=gen).to(BF).contiguous(memory_format=CL)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = torch.empty(n, k, ho, wo, dtype=BF).contiguous(memory_format=CL) if slot else None
        run = winograd.build(plan, lambda: x, None if other is None else (lambda: other), 4, out)
        y = run()
        y2 = run()
    finally:
        torch.set_num_threads(old)
    assert out is None or y is out
    assert torch.equal(y, y2)
    _check(y, _reference(plan, x, other))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "n, c, h, w, k, pad",
    [
        (1, 16, 16, 16, 16, 1),  # whole tiles, one vector of channels
        (1, 17, 11, 13, 23, 1),  # tiles overhang; channels not a multiple of 16 (tails)
        (3, 20, 9, 7, 40, 0),  # three images, no padding
        (1, 3, 3, 3, 5, 0),  # one output
        (2, 33, 5, 6, 70, 1),  # output channels over one 64-block, a tail
        (3, 64, 14, 14, 64, 1),  # several tile blocks over images
        (1, 130, 7, 7, 131, 1),  # few tiles: the output channels split between threads
    ],
)
def test_bf16_matches_float64_conv(n, c, h, w, k, pad, threads) -> None:
    _run(n, c, h, w, k, pad, threads=threads, unary="relu")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "unary, scalars, add, add_after",
    [
        ("none", [], False, False),
        ("relu", [], False, False),
        ("hardtanh", [0.0, 6.0], False, False),
        ("swish", [], False, False),
        ("relu", [], True, False),  # ResNet's residual: relu(conv + bias + other)
        ("none", [], True, False),
        ("swish", [], True, False),
        ("swish", [], True, True),  # YOLO's bottleneck: silu(conv + bias) + other
    ],
)
def test_bf16_epilogue(unary, scalars, add, add_after, threads) -> None:
    _run(2, 19, 10, 9, 33, threads=threads, add=add, unary=unary, scalars=scalars,
         add_after=add_after)  # fmt: skip


@pytest.mark.parametrize("add, add_after", [(False, False), (True, False), (True, True)])
def test_bf16_swish_left_to_torch_stays_on_onednn(add, add_after, monkeypatch) -> None:
    """`PGX_WINOGRAD_NATIVE_SILU=0` would leave a swish to torch, on the output already
    rounded to bf16 (two roundings): the native kernel refuses such a bf16 layer, which runs
    on oneDNN's bf16 kernel instead (its swish before the one rounding: `_check`'s bound);
    other activations, and float32 layers, are still taken."""
    from pygraphx.targets.torch_lowering import onednn_conv
    from pygraphx.targets.torch_lowering.conv_kernels import build_kernel

    monkeypatch.setenv(winograd_native.SILU_ENV, "0")
    gen = torch.Generator().manual_seed(3)
    plan = _plan(2, 19, 10, 9, 33, 1, gen, unary="swish", add_after=add_after)
    if add:
        plan.other = 0
    assert not winograd_native.supports(plan) and not winograd.supports_bf16(plan)
    assert "winograd" not in kernels_for(plan)
    x = torch.randn(2, 19, 10, 9, generator=gen).to(BF).contiguous(memory_format=CL)
    other = torch.randn(2, 33, 10, 9, generator=gen).to(BF).contiguous(memory_format=CL)
    get_other = (lambda: other) if add else None
    with pytest.raises(ValueError, match="bf16"):
        winograd.build(plan, lambda: x, get_other, 4)()
    if onednn_conv.available():  # the layer's route: one rounding
        y = build_kernel(plan, "dnnl", lambda: x, get_other)()
        _check(y, _reference(plan, x, other if add else None))
    relu = _plan(1, 16, 8, 8, 16, 1, gen, unary="relu")
    assert winograd.supports_bf16(relu)
    f32 = _plan(1, 16, 8, 8, 16, 1, gen, unary="swish")
    f32.weight = f32.packed = f32.weight.float()
    assert winograd_native.supports(f32) and winograd.supports(f32)


@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_strided_input_slot_bf16_bias_no_bias(threads: int) -> None:
    _run(1, 24, 13, 9, 20, threads=threads, strided=True, unary="relu")
    _run(2, 24, 9, 13, 36, threads=threads, slot=True, unary="swish", bias_dtype=BF)
    _run(1, 40, 8, 8, 16, pad=0, threads=threads, slot=True, unary="none", bias=None)


def test_bf16_kernel_refuses_float32_activations() -> None:
    gen = torch.Generator().manual_seed(1)
    plan = _plan(1, 16, 8, 8, 16, 1, gen)
    x = torch.randn(1, 16, 8, 8).contiguous(memory_format=CL)  # float32: not the layer's type
    with pytest.raises(ValueError, match="bfloat16"):
        winograd.build(plan, lambda: x, None, 4)()


def test_rule_and_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule names big-map layers of 16+ (1 thread) / 32+ (2 threads) channels and 256+
    pixels; `PGX_WINOGRAD_NATIVE_BF16=0` (or `PGX_WINOGRAD_NATIVE=0`) takes none."""
    gen = torch.Generator().manual_seed(2)
    big32 = _plan(1, 32, 80, 80, 32, 1, gen)  # YOLOv8-style's
    big16 = _plan(1, 16, 160, 160, 16, 1, gen)
    small = _plan(1, 256, 14, 14, 256, 1, gen)  # ResNet-50's 14x14 at batch 1: 196 pixels
    rgb = _plan(1, 3, 256, 256, 32, 1, gen)  # UNet's input layer
    assert "winograd" in kernels_for(big32) and "winograd2" not in kernels_for(big32)
    assert winograd_rule.by_rule(big32, 1) and winograd_rule.by_rule(big32, 2)
    assert winograd_rule.by_rule(big16, 1) and not winograd_rule.by_rule(big16, 2)
    assert not winograd_rule.by_rule(small, 1) and not winograd_rule.by_rule(small, 2)
    assert not winograd_rule.by_rule(rgb, 1)
    assert not winograd_rule.by_rule(big32, winograd_rule.RULE_BF16_MAX_THREADS + 1)
    for env in (winograd_native.BF16_ENV, winograd_native.NATIVE_ENV):
        monkeypatch.setenv(env, "0")
        assert "winograd" not in kernels_for(big32)
        assert not winograd_rule.by_rule(big32, 1)
        monkeypatch.delenv(env)
    assert winograd_rule.by_rule(big32, 1)


def test_failed_library_is_not_rebuilt_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where the kernel cannot be had tries the build once per process."""
    calls = []

    def failing(name: str, extra_flags: object = ()) -> object:
        calls.append(name)
        raise native.NativeUnavailable("no compiler here (test)")

    fresh = native.BoundLibrary(winograd_native.KERNEL, winograd_native._bind)
    monkeypatch.setattr(winograd_native, "_BOUND", fresh)
    monkeypatch.setattr(native.compiler, "load", failing)
    assert not winograd_native.available() and not winograd_native.available()
    assert not winograd_native.bf16_available()
    assert calls == [winograd_native.KERNEL]


def _bf16_net() -> tuple[object, dict[str, np.ndarray]]:
    """Conv-relu, conv + residual + relu, conv-swish on a 40x40 map of 32 channels (the residual
    an inner activation: bf16 in the bf16 program)."""
    from onnx import helper

    from tests.helpers import make_model

    rng = np.random.default_rng(5)
    c = 32

    def f32(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    inits = {"w0": f32(c, c, 3, 3), "b0": f32(c), "w1": f32(c, c, 3, 3), "b1": f32(c),
             "w2": f32(c, c, 3, 3), "b2": f32(c)}  # fmt: skip
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        node("Relu", ["c0"], ["a0"]),
        node("Conv", ["a0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        node("Add", ["c1", "a0"], ["s1"]),
        node("Relu", ["s1"], ["a1"]),
        node("Conv", ["a1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        node("Sigmoid", ["c2"], ["g2"]),
        node("Mul", ["c2", "g2"], ["y"]),
    ]
    feeds = {"x": rng.standard_normal((1, c, 40, 40)).astype(np.float32)}
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_program_takes_the_kernel_and_matches_ort(
    threads: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bf16 program's 3x3 layers run on the kernel by the rule; its output within bf16's
    error of ONNX Runtime's float32, and of the same program on oneDNN's bf16 kernels."""
    from pygraphx.targets.cpu.target import CpuTarget
    from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16
    from tests.helpers import run_ort

    if not cpu_has_bf16():
        pytest.skip("no bf16 instructions: a bf16 program's convolutions are not oneDNN's bf16")
    monkeypatch.setenv(conv_choice.CACHE_ENV, "off")
    for name in (conv_choice.KERNEL_ENV, conv_choice.WINOGRAD_ENV):
        monkeypatch.delenv(name, raising=False)
    model, feeds = _bf16_net()
    want = run_ort(model, feeds)[0]
    outs, chosen = {}, {}
    for switch in ("1", "0"):
        monkeypatch.setenv(winograd_native.BF16_ENV, switch)
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        pygraphx.quantize_bf16(prog)
        bf16_convs = sum(
            ins.op.name == "convolution" and ins.shape.type() == "bf16_type"
            for ins in prog.get_main_module().instructions
        )
        with caplog.at_level(logging.INFO, logger="pygraphx.cpu"):
            prog.compile(CpuTarget(threads=threads))
        outs[switch] = np.asarray(prog.run(feeds)[0], np.float64)
        chosen[switch] = prog._executable.lowered.ctx.cache["conv_choice"].chosen
    # (a layer the quantizer leaves in float32 takes F(4,3) by the float32 rule either way)
    assert bf16_convs >= 2 and chosen["1"]["winograd"] - chosen["0"]["winograd"] == bf16_convs
    for got in outs.values():
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 2e-2, f"relative RMS error {err:.2e} against ORT float32"
    diff = np.linalg.norm(outs["1"] - outs["0"]) / np.linalg.norm(outs["0"])
    assert diff < 1e-2
