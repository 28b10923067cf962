"""A 1x1 convolution and the depthwise 3x3 one after it as one oneDNN primitive
(`conv_dw_fusion.py`, the `dw` field of a `ConvPlan`).

The primitive against torch's float64 `F.conv2d` chain; inverted-residual networks against
ONNX Runtime, with the fused step counted (one step for the four instructions where oneDNN
runs the pair as one kernel), the profiled (unfused) path, the switch, and patterns that must
not fuse.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_dw_fusion import enabled  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan, build_kernel  # noqa: E402
from tests.helpers import make_model, run_ort  # noqa: E402

needs_dnnl = pytest.mark.skipif(
    not onednn_conv.available(), reason="oneDNN's C API library (onednn-cpu-gomp) not installed"
)
CL = torch.channels_last
CLIP = [0.0, 6.0]


def _pair(n: int, c: int, h: int, e: int, stride: int, dw_bias: bool, unary: str) -> tuple:
    gen = torch.Generator().manual_seed(n * 1000 + c + h + e + stride)
    w1, b1 = torch.randn(e, c, 1, 1, generator=gen) * 0.3, torch.randn(e, generator=gen) * 0.1
    w2 = torch.randn(e, 1, 3, 3, generator=gen) * 0.3
    b2 = torch.randn(e, generator=gen) * 0.1 if dw_bias else None
    scalars = CLIP if unary == "hardtanh" else []
    dw = ConvPlan(w2, None, [n, e, h, h], [1, 1], [stride] * 2, [1, 1], e, None, b2, unary,
                  scalars)  # fmt: skip
    plan = ConvPlan(w1, None, [n, c, h, h], [0, 0], [1, 1], [1, 1], 1, None, b1, "hardtanh",
                    CLIP, dw=dw)  # fmt: skip
    x = torch.randn(n, c, h, h, generator=gen).contiguous(memory_format=CL)
    return plan, x


def _oracle(plan: ConvPlan, x: torch.Tensor) -> torch.Tensor:
    dw, d = plan.dw, torch.float64
    y = F.conv2d(x.to(d), plan.weight.to(d), plan.bias.to(d)).clamp(*CLIP)
    bias = None if dw.bias is None else dw.bias.to(d)
    y = F.conv2d(y, dw.weight.to(d), bias, dw.stride, dw.padding, 1, dw.groups)
    return y.clamp(*CLIP) if dw.unary == "hardtanh" else y.relu() if dw.unary == "relu" else y


@needs_dnnl
@pytest.mark.parametrize(
    "shape",
    [
        (1, 16, 112, 96, 2),
        (1, 16, 113, 96, 2),
        (1, 24, 28, 144, 1),
        (8, 32, 14, 192, 2),
        (2, 16, 9, 32, 2),
    ],  # fmt: skip
)
@pytest.mark.parametrize("dw_bias,unary", [(True, "hardtanh"), (False, "relu"), (True, "none")])
def test_primitive_against_torch(shape: tuple, dw_bias: bool, unary: str) -> None:
    plan, x = _pair(*shape, dw_bias, unary)
    got = build_kernel(plan, "dnnl", lambda: x, None)()
    want = _oracle(plan, x)
    assert got.shape == want.shape and got.is_contiguous(memory_format=CL)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    out = torch.empty(want.shape).contiguous(memory_format=CL)  # an arena slot, written in place
    assert build_kernel(plan, "dnnl", lambda: x, None, out)() is out
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_primitive_per_thread_count() -> None:
    """A primitive made for each thread count: the same values on each."""
    plan, x = _pair(1, 16, 112, 96, 2, True, "hardtanh")
    run, want = build_kernel(plan, "dnnl", lambda: x, None), _oracle(plan, x)
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            torch.testing.assert_close(run().double(), want, rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(before)
    assert set(run.primitives) >= {1}


def _block_net(n: int, c: int, h: int, e: int, stride: int, dw_pads: int = 1, k: int = 3):
    """MobileNetV2's inverted residual: 1x1 expand + clip, depthwise + clip, 1x1 project, and
    the residual add where the shapes allow it."""
    rng = np.random.default_rng(c + h + e)
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    inits = {
        "we": w(e, c, 1, 1), "be": w(e) * 0.2, "wd": w(e, 1, k, k), "bd": w(e) * 0.2,
        "wp": w(c, e, 1, 1), "bp": w(c) * 0.2, "lo": np.array(0.0, np.float32),
        "hi": np.array(6.0, np.float32),
    }  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "we", "be"], ["ce"]),
        helper.make_node("Clip", ["ce", "lo", "hi"], ["ae"]),
        helper.make_node(
            "Conv", ["ae", "wd", "bd"], ["cd"], group=e, strides=[stride] * 2, pads=[dw_pads] * 4
        ),  # fmt: skip
        helper.make_node("Clip", ["cd", "lo", "hi"], ["ad"]),
        helper.make_node("Conv", ["ad", "wp", "bp"], ["cp"]),
    ]
    out = "cp"
    if stride == 1 and dw_pads * 2 == k - 1:
        nodes.append(helper.make_node("Add", ["x", "cp"], ["y"]))
        out = "y"
    return make_model(nodes, {"x": x}, [out], inits), {"x": x}


def _compile(model, fusion: str, monkeypatch, **target) -> pygraphx.Program:  # noqa: ANN001
    monkeypatch.setenv("PGX_CONV_DW_FUSION", fusion)
    monkeypatch.setenv("PGX_CPU_NATIVE_MBCONV", "0")  # (the oneDNN route: test_native_mbconv)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1, **target))
    return prog


def _native(
    n: int, c: int, h: int, e: int, stride: int, dtype: torch.dtype = torch.float32
) -> bool:
    plan, _ = _pair(n, c, h, e, stride, True, "hardtanh")
    plan.weight, plan.dw.weight = plan.weight.to(dtype), plan.dw.weight.to(dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return not onednn_conv.first_implementation(plan).startswith("ref")
    finally:
        torch.set_num_threads(before)


@needs_dnnl
@pytest.mark.parametrize(
    "shape,output",
    [((1, 16, 112, 96, 2), "arena"), ((1, 16, 113, 96, 2), "torch"), ((4, 32, 28, 192, 1), "arena"),
     ((4, 32, 28, 192, 1), "torch"), ((1, 16, 20, 96, 2), "arena")],
)  # fmt: skip
def test_network_against_ort(shape: tuple, output: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where results live: arena slots (the step writes the last group's slot) or new tensors
    (`conv_output="torch"`)."""
    monkeypatch.setenv("PGX_DEBUG_MEMORY_COLORING", "1")
    model, feeds = _block_net(*shape)
    want = run_ort(model, feeds)[0]
    prog = _compile(model, "on", monkeypatch, conv_output=output)
    for _ in range(2):  # a second run reads the slots the first one left behind
        np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    ctx = prog._executable.lowered.ctx
    fused = ctx.cache.get("conv_dw_fused", 0)
    assert fused == int(_native(*shape))
    steps = [[i.op.name for i in s.instructions] for s in prog._executable.lowered.steps]
    if fused:
        assert ["convolution", "pointwise", "convolution", "pointwise"] in steps, steps
    seen: list[str] = []  # profiling runs the unfused steps: the same values
    profiled = prog.run(feeds, observer=lambda ins, v, s: seen.append(ins.name()))
    np.testing.assert_allclose(profiled[0], want, rtol=1e-4, atol=1e-4)
    assert seen.count("convolution") == 3
    off = _compile(model, "off", monkeypatch)
    assert off._executable.lowered.ctx.cache.get("conv_dw_fused", 0) == 0
    np.testing.assert_allclose(off.run(feeds)[0], want, rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_mobilenet_first_block_is_fused_on_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    """MobileNetV2's second block at batch 1 (16x112x112 -> 96, stride 2) is the pair oneDNN
    fuses natively on an AVX-512 CPU (the measured case)."""
    plan, _ = _pair(1, 16, 112, 96, 2, True, "hardtanh")
    impl = onednn_conv.implementations(plan, False)[0]
    if "avx512" not in impl:
        pytest.skip(f"no AVX-512 kernel here ({impl})")
    assert _native(1, 16, 112, 96, 2)


@needs_dnnl
@pytest.mark.parametrize("case", ["5x5", "pad 0"])
def test_other_depthwise_layers_not_fused(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    k, pads = (5, 2) if case == "5x5" else (3, 0)
    model, feeds = _block_net(1, 16, 112, 96, 2, dw_pads=pads, k=k)
    want = run_ort(model, feeds)[0]
    prog = _compile(model, "on", monkeypatch)
    np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    assert prog._executable.lowered.ctx.cache.get("conv_dw_fused", 0) == 0


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGX_CONV_DW_FUSION", raising=False)
    assert enabled({}) and not enabled({"conv_dw_fusion": False})
    monkeypatch.setenv("PGX_CONV_DW_FUSION", "OFF")
    assert not enabled({}) and enabled({"conv_dw_fusion": True})
    monkeypatch.setenv("PGX_CONV_DW_FUSION", "maybe")
    with pytest.raises(ValueError, match="PGX_CONV_DW_FUSION"):
        enabled({})


def _bf16_ok() -> bool:
    plan, _ = _pair(1, 16, 9, 32, 2, True, "hardtanh")
    plan.weight, plan.dw.weight = plan.weight.bfloat16(), plan.dw.weight.bfloat16()
    return onednn_conv.available() and onednn_conv.supports(plan)


@needs_dnnl
@pytest.mark.parametrize("shape", [(1, 16, 112, 96, 2), (2, 24, 9, 48, 1)])
def test_bf16_primitive_against_torch(shape: tuple) -> None:
    """bf16 in and out, the biases in bf16 (as the lowering gives them): against float64 on
    the bf16 values, the 1x1 result rounded to bf16 as the unfused steps would."""
    if not _bf16_ok():
        pytest.skip("no bf16 instructions")
    plan, x = _pair(*shape, True, "hardtanh")
    bf = torch.bfloat16
    plan.weight, plan.bias = plan.weight.to(bf), plan.bias.to(bf)
    plan.dw.weight, plan.dw.bias = plan.dw.weight.to(bf), plan.dw.bias.to(bf)
    x = x.to(bf)
    got = build_kernel(plan, "dnnl", lambda: x, None)()
    assert got.dtype == bf
    dw, d = plan.dw, torch.float64
    y = F.conv2d(x.to(d), plan.weight.to(d), plan.bias.to(d)).clamp(*CLIP).to(bf).to(d)
    want = F.conv2d(y, dw.weight.to(d), dw.bias.to(d), dw.stride, dw.padding, 1, dw.groups)
    want = want.clamp(*CLIP)
    tol = 2.0**-7 * float(want.abs().max())
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@needs_dnnl
def test_bf16_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program `quantize_bf16` made all bf16: the pair fused as in float32 (1 thread,
    16x112x112 -> 96, whose bf16 expanded tensor is 2.4 MB), the outputs of the fused and
    unfused programs within bf16 rounding of each other and of ORT's float32 answer."""
    if not _bf16_ok():
        pytest.skip("no bf16 instructions")
    model, feeds = _block_net(1, 16, 112, 96, 2)
    want = run_ort(model, feeds)[0]
    got = {}
    monkeypatch.setenv("PGX_CPU_NATIVE_MBCONV", "0")
    for mode in ("on", "off"):
        monkeypatch.setenv("PGX_CONV_DW_FUSION", mode)
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        pygraphx.quantize_bf16(prog, ["all"])  # (by default the last group goes to float32)
        prog.compile(CpuTarget(threads=1))
        got[mode] = np.asarray(prog.run(feeds)[0], dtype=np.float32)
        fused = prog._executable.lowered.ctx.cache.get("conv_dw_fused", 0)
        assert fused == (int(_native(1, 16, 112, 96, 2, torch.bfloat16)) if mode == "on" else 0)
    scale = float(np.abs(want).max())
    for mode in ("on", "off"):
        np.testing.assert_allclose(got[mode], want, rtol=0, atol=0.05 * scale)
    np.testing.assert_allclose(got["on"], got["off"], rtol=0, atol=0.02 * scale)
