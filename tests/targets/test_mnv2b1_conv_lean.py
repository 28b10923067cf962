"""`onednn_conv.build`'s lean closure for a layer writing its arena slot (`_run_into`): the
source's layout and address are checked only when the source is another tensor than the last
call's. Every case against torch's float64 convolution of the same values: the same tensor
written in place between calls, a new tensor each call, an NCHW source (reordered each call),
another thread count; and a model against ONNX Runtime with the lean closure on and off."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan  # noqa: E402
from tests.helpers import make_model  # noqa: E402

pytestmark = pytest.mark.skipif(
    not onednn_conv.available(), reason="needs oneDNN's C API library (onednn-cpu-gomp)"
)
CL = torch.channels_last
RNG = np.random.default_rng(5)


def plan(c: int = 8, k: int = 16, hw: int = 9) -> ConvPlan:
    w = torch.from_numpy(RNG.standard_normal((k, c, 3, 3)).astype(np.float32) / 5)
    b = torch.from_numpy(RNG.standard_normal(k).astype(np.float32))
    return ConvPlan(weight=w, packed=w, x_lens=[1, c, hw, hw], padding=[1, 1], stride=[1, 1],
                    dilation=[1, 1], groups=1, pre_pad=None, bias=b, unary="relu",
                    kernel="dnnl")  # fmt: skip


def want(p: ConvPlan, x: torch.Tensor) -> np.ndarray:
    y = torch.nn.functional.conv2d(x.double(), p.weight.double(), p.bias.double(), padding=1)
    return torch.relu(y).numpy()


def new_x(p: ConvPlan, layout=CL) -> torch.Tensor:
    x = torch.from_numpy(RNG.standard_normal(p.x_lens).astype(np.float32))
    return x.contiguous(memory_format=layout)


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_lean_closure_is_taken_and_writes_the_slot():
    p = plan()
    out = torch.empty([1, 16, 9, 9]).contiguous(memory_format=CL)
    x = new_x(p)
    run = onednn_conv.build(p, lambda: x, None, out)
    assert run.writes is out  # the lean closure (`conv_steps.into` takes it as the step)
    assert run() is out
    np.testing.assert_allclose(out.numpy(), want(p, x), rtol=1e-5, atol=1e-5)


def test_same_tensor_written_in_place_between_calls():
    p = plan()
    out = torch.empty([1, 16, 9, 9]).contiguous(memory_format=CL)
    x = new_x(p)
    run = onednn_conv.build(p, lambda: x, None, out)
    for _ in range(3):
        x.copy_(new_x(p))  # (an arena slot: same tensor, new values every run)
        run()
        np.testing.assert_allclose(out.numpy(), want(p, x), rtol=1e-5, atol=1e-5)


def test_a_new_tensor_each_call_and_an_nchw_source():
    p = plan()
    out = torch.empty([1, 16, 9, 9]).contiguous(memory_format=CL)
    holder = [new_x(p)]
    run = onednn_conv.build(p, lambda: holder[0], None, out)
    for layout in (CL, torch.contiguous_format, CL, torch.contiguous_format):
        holder[0] = new_x(p, layout)
        run()
        np.testing.assert_allclose(out.numpy(), want(p, holder[0]), rtol=1e-5, atol=1e-5)


def test_a_slot_getter_is_read_directly():
    """A getter of `conv_steps.env_getter` (the lowering's) is read as its list slot: a new
    tensor stored there, or the same one written in place, is what the next call reads."""
    from pygraphx.targets.torch_lowering.conv_fusion import env_getter

    p = plan()
    out = torch.empty([1, 16, 9, 9]).contiguous(memory_format=CL)
    env = [None, new_x(p)]
    run = onednn_conv.build(p, env_getter(env, 1), None, out)
    for fresh in (True, False, True):
        if fresh:
            env[1] = new_x(p)
        else:
            env[1].copy_(new_x(p))
        run()
        np.testing.assert_allclose(out.numpy(), want(p, env[1]), rtol=1e-5, atol=1e-5)


def test_a_strided_source_is_made_dense():
    p = plan()
    out = torch.empty([1, 16, 9, 9]).contiguous(memory_format=CL)
    big = new_x(plan(c=16))
    x = big[:, ::2]  # every second channel: neither layout dense
    run = onednn_conv.build(p, lambda: x, None, out)
    run()
    np.testing.assert_allclose(out.numpy(), want(p, x), rtol=1e-5, atol=1e-5)


def test_add_operand_same_and_new_tensors():
    """A binary add post-op: the operand's address is set when the operand tensor changes."""
    p = plan()
    p.unary = "none"
    out = torch.empty([1, 16, 9, 9]).contiguous(memory_format=CL)
    x = new_x(p)
    holder = [new_x(plan(c=16))]
    run = onednn_conv.build(p, lambda: x, lambda: holder[0], out)
    assert run.writes is out
    for fresh in (False, True, False, True):
        if fresh:
            holder[0] = new_x(plan(c=16), torch.contiguous_format)  # converted each call
        else:
            holder[0].copy_(new_x(plan(c=16)))
        run()
        y = torch.nn.functional.conv2d(x.double(), p.weight.double(), p.bias.double(), padding=1)
        np.testing.assert_allclose(out.numpy(), (y + holder[0].double()).numpy(), rtol=1e-5,
                                   atol=1e-5)  # fmt: skip


def test_another_thread_count_gets_its_own_primitive(threads):
    threads(1)
    p = plan()
    out = torch.empty([1, 16, 9, 9]).contiguous(memory_format=CL)
    x = new_x(p)
    run = onednn_conv.build(p, lambda: x, None, out)
    run()
    threads(2)
    x.copy_(new_x(p))
    run()
    assert set(run.primitives) == {1, 2}
    np.testing.assert_allclose(out.numpy(), want(p, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lean", [True, False])
def test_model_against_ort(monkeypatch, lean: bool):
    """Two convolutions and a residual add (arena slots, an add operand) against ORT, with
    the lean closure on and off, over three runs on new inputs."""
    monkeypatch.setattr(onednn_conv, "LEAN_CLOSURE", lean)
    x = RNG.standard_normal((1, 8, 10, 10)).astype(np.float32)
    inits = {
        "w1": (RNG.standard_normal((8, 8, 3, 3)) / 5).astype(np.float32),
        "w2": (RNG.standard_normal((8, 8, 1, 1)) / 3).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["c"]),
        helper.make_node("Add", ["c", "r"], ["s"]),
        helper.make_node("Conv", ["s", "w1"], ["y"], pads=[1, 1, 1, 1]),
    ]
    model = make_model(nodes, {"x": x}, ["y"], inits)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    lean_steps = [s for s in prog._executable.lowered.steps if hasattr(s.fn, "writes")]
    assert bool(lean_steps) == lean
    for _ in range(3):
        x = RNG.standard_normal((1, 8, 10, 10)).astype(np.float32)
        got = np.array(prog.run({"x": x})[0])
        np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
