"""bf16 convolutions on the `dnnl` kernel (oneDNN's C API, `onednn_conv.py`).

Each layer form runs with bf16 activations, weights and output, against torch's NCHW
`F.conv2d` in float64 on the same bf16 values (the epilogue in float64 too): the only error
allowed is the output's rounding to bf16 (half a bf16 unit, 2^-9 relative) and float32
accumulation. A whole bf16 network (`quantize_bf16`) runs every convolution on `dnnl`, natively
(oneDNN's bf16 implementations), within bf16's error of ONNX Runtime's float32 results.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")


import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import (  # noqa: E402
    ConvPlan,
    build_kernel,
    kernels_for,
)
from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16  # noqa: E402
from tests.targets.test_cpu_onednn_conv import LAYERS, UNARY, _oracle, _plan  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (onednn_conv.available() and cpu_has_bf16()),
    reason="needs oneDNN's C API library (onednn-cpu-gomp) and a CPU with bf16 instructions",
)
CL = torch.channels_last
BF = torch.bfloat16


def _cpu_flags() -> str:
    """The processor's feature flags (Linux; '' elsewhere)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _bf16_plan(x_lens: list[int], w_lens: list[int], **kw: object) -> ConvPlan:
    plan = _plan(x_lens, w_lens, **kw)  # type: ignore[arg-type]
    plan.weight = plan.weight.to(BF)
    plan.bias = None if plan.bias is None else plan.bias.to(BF)
    return plan


def _oracle64(plan: ConvPlan, x: torch.Tensor, other: torch.Tensor | None) -> torch.Tensor:
    """The float64 convolution of the bf16 values, and its epilogue in float64."""
    return _oracle(plan, x.double(), other)


def _assert_bf16_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    """`got` (bf16) is `want` rounded to bf16: within half a bf16 unit (2^-9 relative, here
    2^-8 to leave room for float32 accumulation) plus a tiny absolute slack near zero."""
    assert got.dtype == BF
    err = (got.double() - want).abs()
    bound = want.abs() * 2.0**-8 + 1e-3 * float(want.abs().max()) + 1e-6
    worst = float((err - bound).max())
    assert worst <= 0, f"error beyond bf16 rounding by {worst}"


@pytest.mark.parametrize("nchw", [False, True])
@pytest.mark.parametrize("unary", list(UNARY))
@pytest.mark.parametrize("layer", list(LAYERS))
def test_bf16_layer_matches_float64(layer: str, unary: str, nchw: bool) -> None:
    x_lens, w_lens, kw = LAYERS[layer]
    plan = _bf16_plan(x_lens, w_lens, unary=unary, **kw)
    assert "dnnl" in kernels_for(plan)
    x = torch.randn(x_lens).to(BF)
    x = x if nchw else x.contiguous(memory_format=CL)
    run = build_kernel(plan, "dnnl", lambda: x, None)
    got = run()
    assert got.is_contiguous(memory_format=CL) and list(got.shape) == list(
        _oracle64(plan, x, None).shape
    )
    _assert_bf16_rounding(got, _oracle64(plan, x, None))
    (prim,) = run.primitives.values()
    # a JIT kernel, not oneDNN's reference one (`..._bf16` where the CPU has avx512_bf16 / AMX;
    # oneDNN emulates bf16 on a plain avx512_core, which torch also counts as bf16-capable)
    assert not prim.impl.startswith("ref") and ":" in prim.impl, prim.impl
    if "avx512_bf16" in _cpu_flags() or "amx_bf16" in _cpu_flags():
        assert "bf16" in prim.impl, prim.impl


def test_bf16_float32_bias() -> None:
    """A float32 bias (oneDNN takes either type with bf16 data) is added at float32."""
    plan = _bf16_plan([1, 16, 9, 9], [24, 16, 3, 3], begin=(1, 1), end=(1, 1), unary="relu")
    plan.bias = torch.randn(24) * 3
    x = torch.randn(1, 16, 9, 9).to(BF).contiguous(memory_format=CL)
    _assert_bf16_rounding(build_kernel(plan, "dnnl", lambda: x, None)(), _oracle64(plan, x, None))


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("unary", ["none", "relu", "hardtanh"])
def test_bf16_residual_add(in_place: bool, unary: str) -> None:
    plan = _bf16_plan([1, 24, 10, 10], [16, 24, 1, 1], unary=unary)
    plan.other, plan.in_place = 0, in_place
    x = torch.randn(1, 24, 10, 10).to(BF).contiguous(memory_format=CL)
    other = torch.randn(1, 16, 10, 10).to(BF).contiguous(memory_format=CL)
    want = _oracle64(plan, x, other)
    operand = other.clone()
    got = build_kernel(plan, "dnnl", lambda: x, lambda: operand)()
    _assert_bf16_rounding(got, want)
    assert (got.data_ptr() == operand.data_ptr()) == in_place
    if not in_place:
        assert torch.equal(operand, other)


def _cnn() -> tuple:
    from onnx import helper

    from tests.helpers import make_model

    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, 16, 16)).astype(np.float32)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    inits = {
        "w1": w(16, 8, 1, 1), "b1": w(16) * 0.1, "w2": w(16, 1, 3, 3), "b2": w(16) * 0.1,
        "w3": w(8, 16, 1, 1), "b3": w(8) * 0.1, "w4": w(8, 8, 3, 3),
        "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32),
    }  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["a1"]),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], group=16, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["a2"]),
        helper.make_node("Conv", ["a2", "w3", "b3"], ["c3"]),
        helper.make_node("Add", ["c3", "x"], ["r"]),
        helper.make_node("Conv", ["r", "w4"], ["c4"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c4"], ["y"]),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


def test_bf16_network_runs_every_convolution_on_dnnl(caplog: pytest.LogCaptureFixture) -> None:
    """MobileNetV2's block forms (1x1 + relu6, depthwise + relu6, 1x1 + residual) and a
    strided 3x3 + relu, in bf16: every convolution on `dnnl` (the compile's log line says
    so), the result within bf16's error of ONNX Runtime at float32 and not float32's."""
    from tests.helpers import run_ort

    model, feeds = _cnn()
    want = run_ort(model, feeds)[0]
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog)
    with caplog.at_level(logging.INFO, logger="pygraphx.cpu"):
        prog.compile(CpuTarget(threads=1))
    kernels = [r.getMessage() for r in caplog.records if "convolution kernels" in r.getMessage()]
    assert kernels and "onednn" not in kernels[-1], kernels
    chosen = re.findall(r"(\S+) x(\d+)", kernels[-1].split("(")[0])  # "dnnl[/impl] xN, ..."
    assert sum(int(n) for k, n in chosen if k.partition("/")[0] == "dnnl") == 4, kernels
    got = np.asarray(prog.run(feeds)[0], np.float64)
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert 1e-5 < err < 2e-2, err


@pytest.mark.parametrize("kernel", ["measure", "onednn", "matmul", "torch_cl"])
def test_bf16_network_on_each_kernel(kernel: str, caplog: pytest.LogCaptureFixture) -> None:
    """A bf16 layer takes a forced kernel where it applies, and `measure` times the candidates
    on bf16 inputs; every kernel gives a result within bf16's error of ORT at float32."""
    from pygraphx.targets.torch_lowering import conv_choice
    from tests.helpers import run_ort

    conv_choice.clear_cache()
    model, feeds = _cnn()
    want = run_ort(model, feeds)[0]
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog)
    with caplog.at_level(logging.INFO, logger="pygraphx.cpu"):
        prog.compile(CpuTarget(threads=1, conv_kernel=kernel))
    (line,) = [r.getMessage() for r in caplog.records if "convolution kernels" in r.getMessage()]
    if kernel == "measure":
        assert "measured 4 layer(s)" in line, line
    elif kernel == "matmul":  # the two 1x1 stride-1 layers; the others the default
        assert "matmul x2" in line and "dnnl x2" in line, line
    elif kernel == "torch_cl":  # the two layers whose bias kept its float32 value take the
        # default: F.conv2d would round it (`conv_kernels.kernels_for`)
        assert "torch_cl x2" in line and "dnnl x2" in line, line
    else:
        assert f"{kernel} x4" in line, line
    got = np.asarray(prog.run(feeds)[0], np.float64)
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert 1e-5 < err < 2e-2, err


def test_reference_kernel_is_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where oneDNN has no JIT kernel for a layer (a processor torch counts as bf16-capable
    that oneDNN 3.2 does not), the slow reference kernel is said once, not run silently."""
    from pygraphx.targets.torch_lowering import onednn_capi

    monkeypatch.setattr(onednn_capi.Runtime, "impl_name", lambda self, pd: "ref:any")
    monkeypatch.setattr(onednn_conv, "_SAID", set())
    plan = _bf16_plan([1, 8, 6, 6], [8, 8, 1, 1])
    x = torch.randn(1, 8, 6, 6).to(BF).contiguous(memory_format=CL)
    with caplog.at_level(logging.WARNING, logger="pygraphx.cpu"):
        for _ in range(2):
            _assert_bf16_rounding(
                build_kernel(plan, "dnnl", lambda: x, None)(), _oracle64(plan, x, None)
            )
    said = [r.getMessage() for r in caplog.records if "reference kernel" in r.getMessage()]
    assert len(said) == 1 and "[1, 8, 6, 6]" in said[0], said
