"""Epilogues only oneDNN's own post-op chain (the `dnnl` kernel) fuses into a convolution.

* act(conv + bias) + other: YOLO's C2f shortcut (Conv-BN-SiLU, then the block's input added):
  the activation post-op, then the binary add (or the in-place sum) after it.
* act(conv + bias + other) with act a clip or silu, or a pre-padded input with an add: torch's
  mkldnn convolution fuses only relu after an add, so these ran as two steps before.

Each form against torch's float64 `F.conv2d` and the epilogue in float64, and in a network
against ONNX Runtime, with the fused step checked to be one step on `dnnl`.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import (  # noqa: E402
    build_kernel,
    fuses_epilogue,
    kernels_for,
)
from tests.helpers import make_model, run_ort  # noqa: E402
from tests.targets.test_cpu_onednn_conv import _oracle, _plan  # noqa: E402

needs_dnnl = pytest.mark.skipif(
    not onednn_conv.available(), reason="oneDNN's C API library (onednn-cpu-gomp) not installed"
)
CL = torch.channels_last


def _oracle64(plan, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    return _oracle(plan, x.double(), other)


def test_kernels_that_fuse_each_epilogue() -> None:
    plan = _plan([1, 8, 6, 6], [8, 8, 1, 1], unary="swish")
    plan.other = 0
    assert "onednn" not in kernels_for(plan) and "matmul" not in kernels_for(plan)
    plan.add_after = True
    assert "onednn" not in kernels_for(plan) and "matmul" not in kernels_for(plan)
    assert fuses_epilogue(plan) == onednn_conv.available()
    plan.unary, plan.add_after = "relu", False
    assert "onednn" in kernels_for(plan) and fuses_epilogue(plan)


@needs_dnnl
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize(
    "form",
    ["silu then add", "relu6 then add", "add then relu6", "add then silu", "pre-pad add"],
)
def test_epilogue_forms(form: str, in_place: bool, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and not onednn_conv.supports(
        _bf16(_plan([1, 1, 1, 1], [1, 1, 1, 1]))
    ):
        pytest.skip("no bf16 instructions")
    unary = {"silu then add": "swish", "add then silu": "swish", "pre-pad add": "relu"}
    kw = {"begin": (0, 0), "end": (1, 1), "stride": 2} if form == "pre-pad add" else {}
    kw = kw or {"begin": (1, 1), "end": (1, 1)}
    plan = _plan([1, 16, 11, 11], [16, 16, 3, 3], unary=unary.get(form, "hardtanh"), **kw)
    plan.other, plan.in_place, plan.add_after = 0, in_place, form.endswith("then add")
    if dtype == torch.bfloat16:
        plan = _bf16(plan)
    x = torch.randn(1, 16, 11, 11).to(dtype).contiguous(memory_format=CL)
    out_lens = onednn_conv.geometry(plan)[3]
    other = torch.randn(out_lens).to(dtype).contiguous(memory_format=CL)
    assert fuses_epilogue(plan) and kernels_for(plan)[0] == "dnnl"
    operand = other.clone()
    got = build_kernel(plan, "dnnl", lambda: x, lambda: operand)()
    want = _oracle64(plan, x, other)
    tol = 1e-4 if dtype == torch.float32 else 2.0**-7 * float(want.abs().max())
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    assert (got.data_ptr() == operand.data_ptr()) == in_place
    cl = build_kernel(plan, "torch_cl", lambda: x, lambda: other.clone())()
    torch.testing.assert_close(cl.double(), want, rtol=tol, atol=tol)


def _bf16(plan):  # noqa: ANN001, ANN202
    plan.weight = plan.weight.to(torch.bfloat16)
    plan.bias = None if plan.bias is None else plan.bias.to(torch.bfloat16)
    return plan


def _c2f_net() -> tuple:
    """YOLOv8's C2f bottleneck with its shortcut (Conv-BN-SiLU twice, then the input added)
    and a MobileNet-like residual with a clip after the sum, at an odd size."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 16, 13, 13)).astype(np.float32)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    inits = {
        "w1": w(16, 16, 3, 3), "b1": w(16) * 0.2, "w2": w(16, 16, 3, 3), "b2": w(16) * 0.2,
        "w3": w(16, 16, 1, 1), "b3": w(16) * 0.2, "lo": np.array(0.0, np.float32),
        "hi": np.array(6.0, np.float32),
    }  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["g1"]),
        helper.make_node("Mul", ["c1", "g1"], ["a1"]),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["g2"]),
        helper.make_node("Mul", ["c2", "g2"], ["a2"]),
        helper.make_node("Add", ["x", "a2"], ["s"]),  # the shortcut, operand first
        helper.make_node("Conv", ["s", "w3", "b3"], ["c3"]),
        helper.make_node("Add", ["c3", "s"], ["r"]),
        helper.make_node("Clip", ["r", "lo", "hi"], ["y"]),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


def _step_kinds(prog: pygraphx.Program) -> list[str]:
    return [
        "+".join(ins.op.name for ins in step.instructions)
        for step in prog._executable.lowered.steps
    ]


@needs_dnnl
@pytest.mark.parametrize("conv_kernel", ["off", "measure"])
def test_network_fuses_shortcut_and_clipped_residual(conv_kernel: str) -> None:
    model, feeds = _c2f_net()
    want = run_ort(model, feeds)[0]
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1, conv_kernel=conv_kernel))
    np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    kinds = _step_kinds(prog)
    assert kinds.count("convolution+pointwise") == 3, kinds  # every epilogue fused
    assert "pointwise" not in kinds, kinds
    seen: list[str] = []  # profiling runs the unfused steps: the same values
    profiled = prog.run(feeds, observer=lambda ins, v, s: seen.append(ins.name()))
    np.testing.assert_allclose(profiled[0], want, rtol=1e-4, atol=1e-4)
    assert seen.count("convolution") == 3


def _chain_net() -> tuple:
    """Six 3x3 convolutions of one size in a chain, each with a bias and relu: the memory plan
    gives some fused groups the memory of their convolution's input (dead by then)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 8, 10, 10)).astype(np.float32)
    inits, nodes, prev = {}, [], "x"
    for k in range(6):
        inits[f"w{k}"] = (rng.standard_normal((8, 8, 3, 3)) / 8.5).astype(np.float32)
        inits[f"b{k}"] = (0.1 * rng.standard_normal(8)).astype(np.float32)
        nodes.append(helper.make_node("Conv", [prev, f"w{k}", f"b{k}"], [f"c{k}"], pads=[1] * 4))
        nodes.append(helper.make_node("Relu", [f"c{k}"], [f"a{k}"]))
        prev = f"a{k}"
    return make_model(nodes, {"x": x}, [prev], inits), {"x": x}


@needs_dnnl
@pytest.mark.parametrize("net", [_chain_net, _c2f_net])
def test_arena_output_written_by_the_kernel(net, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """conv_output="arena": `dnnl` writes every fused result straight into its arena slot (the
    cpu target's plan keeps a fused convolution's input apart from its group's slot); checked
    against ORT with the plan's own check."""
    monkeypatch.setenv("PGX_DEBUG_MEMORY_COLORING", "1")
    model, feeds = net()
    want = run_ort(model, feeds)[0]
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1, conv_output="arena"))
    for _ in range(2):  # a second run reads slots the first one left behind
        np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    fused = _step_kinds(prog).count("convolution+pointwise")
    assert fused >= 3 and prog._executable.lowered.ctx.cache.get("conv_into_slot", 0) == fused
