"""`conv_chain`: consecutive lean oneDNN convolution steps run as one step. A network against
ONNX Runtime with chains on and off (identical outputs), over runs on new inputs; a chain
built by hand against torch's float64 convolutions: a slot holding a new tensor, a slot that
is not channels-last, another thread count; `perf --cpu`'s step times; a failing primitive
named; the profiled (observer) path."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.runtime.evaluator import EvaluationError  # noqa: E402
from pygraphx.targets.cpu.profile import time_steps  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import conv_chain, onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_fusion import env_getter  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan  # noqa: E402
from tests.helpers import make_model  # noqa: E402

pytestmark = pytest.mark.skipif(
    not onednn_conv.available(), reason="needs oneDNN's C API library (onednn-cpu-gomp)"
)
CL = torch.channels_last
RNG = np.random.default_rng(11)


def _network() -> tuple[object, dict[str, np.ndarray]]:
    """Conv chain (3x3, 1x1 + residual add, 3x3 stride 2), a pooling step, two more convs."""
    x = RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)
    inits = {
        "w0": (RNG.standard_normal((8, 3, 3, 3)) / 3).astype(np.float32),
        "w1": (RNG.standard_normal((8, 8, 1, 1)) / 3).astype(np.float32),
        "w2": (RNG.standard_normal((16, 8, 3, 3)) / 5).astype(np.float32),
        "w3": (RNG.standard_normal((16, 16, 1, 1)) / 4).astype(np.float32),
        "b": RNG.standard_normal(8).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w1"], ["c"]),
        helper.make_node("Add", ["c", "r"], ["s"]),
        helper.make_node("Conv", ["s", "w2"], ["d"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Clip", ["d", "lo", "hi"], ["e"]),
        helper.make_node("MaxPool", ["e"], ["p"], kernel_shape=[2, 2], strides=[1, 1]),
        helper.make_node("Conv", ["p", "w3"], ["f"]),
        helper.make_node("Relu", ["f"], ["g"]),
        helper.make_node("Conv", ["g", "w3"], ["y"]),
    ]
    inits["lo"] = np.array(0.0, dtype=np.float32)
    inits["hi"] = np.array(6.0, dtype=np.float32)
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


def _compiled(model: object, chain: bool, monkeypatch: pytest.MonkeyPatch) -> pygraphx.Program:
    monkeypatch.setattr(conv_chain, "CHAIN", chain)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    return prog


def test_network_against_ort_chains_on_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = _network()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    on, off = _compiled(model, True, monkeypatch), _compiled(model, False, monkeypatch)
    chains = [c for c in on._executable.chained.chains if c is not None]
    assert [len(c) for c in chains] == [3, 2]  # (the pooling step cuts the chain)
    assert not any(off._executable.chained.chains)
    assert len(on._executable.executor) == len(on._executable.lowered.steps) - 3
    ((_, x_index),) = on._executable.lowered.params
    for _ in range(3):
        x = RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)
        got = np.array(on.run({"x": x})[0])
        np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(got, off.run({"x": x})[0])  # the same primitives
        assert on._executable.lowered.ctx.env[x_index] is None  # released after its last use


def test_time_steps_reports_each_member(monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = _network()
    prog = _compiled(model, True, monkeypatch)
    prog.run(feeds)
    exe = prog._executable
    steps = time_steps(exe, feeds, 3)
    assert [s.instructions for s in steps] == [s.instructions for s in exe.lowered.steps]
    assert all(s.seconds > 0 for s in steps)
    assert all(c.clock is None for c in exe.chained.chains if c is not None)  # (left off)


def test_profiled_path_with_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = _network()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    prog = _compiled(model, True, monkeypatch)
    prog.run(feeds)
    seen = []
    got = prog._executable.run(feeds, observer=lambda ins, v, s: seen.append(ins))
    assert len(seen) >= len(prog._executable.lowered.steps)
    np.testing.assert_allclose(got[0], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    got = np.array(prog.run(feeds)[0])  # the chain after the profiled run
    np.testing.assert_allclose(got, sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_failing_primitive_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = _network()
    prog = _compiled(model, True, monkeypatch)
    prog.run(feeds)
    chain = next(c for c in prog._executable.chained.chains if c is not None)
    for team in chain.teams.values():
        team.calls[1] = lambda: 2  # dnnl_invalid_arguments
    with pytest.raises(EvaluationError, match=r"convolution 2 of a chain of 3") as err:
        prog.run(feeds)
    message = str(err.value)  # the failing member's instructions and ONNX nodes only
    assert "ONNX nodes Conv #2, Add #3" in message and "Conv #0" not in message


def test_a_view_of_an_earlier_members_result_starts_a_chain(monkeypatch) -> None:
    """A convolution reading a channel half of an earlier convolution's result (a Split:
    a view, copied channels-last before the primitive reads it) reads it after that
    convolution has run: it starts a new chain (a varying input is read at a chain's start)."""
    x = RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)
    inits = {
        "w0": (RNG.standard_normal((16, 4, 3, 3)) / 3).astype(np.float32),
        "w1": (RNG.standard_normal((8, 8, 3, 3)) / 4).astype(np.float32),
        "w2": (RNG.standard_normal((8, 8, 1, 1)) / 3).astype(np.float32),
        "split": np.array([8, 8], dtype=np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Split", ["r", "split"], ["lo", "hi"], axis=1),
        helper.make_node("Conv", ["hi", "w1"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["b"], ["rb"]),
        helper.make_node("Conv", ["rb", "w2"], ["y"]),
    ]
    model = make_model(nodes, {"x": x}, ["y"], inits)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    on = _compiled(model, True, monkeypatch)
    assert [len(c) if c else 1 for c in on._executable.chained.chains] == [1, 2]
    for _ in range(3):
        x = RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)
        got = np.array(on.run({"x": x})[0])
        np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


# --- a chain built by hand ----------------------------------------------------------------


def _plan(c: int, k: int, hw: int) -> ConvPlan:
    w = torch.from_numpy(RNG.standard_normal((k, c, 3, 3)).astype(np.float32) / 5)
    b = torch.from_numpy(RNG.standard_normal(k).astype(np.float32))
    return ConvPlan(weight=w, packed=w, x_lens=[1, c, hw, hw], padding=[1, 1], stride=[1, 1],
                    dilation=[1, 1], groups=1, pre_pad=None, bias=b, unary="relu",
                    kernel="dnnl")  # fmt: skip


def _want(p: ConvPlan, x: torch.Tensor) -> torch.Tensor:
    y = torch.nn.functional.conv2d(x.double(), p.weight.double(), p.bias.double(), padding=1)
    return torch.relu(y)


def _hand_chain(static_input: bool):
    """env = [input, slot a, slot b]; conv 8 -> 16 into a, conv 16 -> 8 into b."""
    p1, p2 = _plan(8, 16, 7), _plan(16, 8, 7)
    a = torch.empty([1, 16, 7, 7]).contiguous(memory_format=CL)
    b = torch.empty([1, 8, 7, 7]).contiguous(memory_format=CL)
    x = torch.from_numpy(RNG.standard_normal((1, 8, 7, 7)).astype(np.float32))
    env = [x.contiguous(memory_format=CL), a, b]
    runs = [onednn_conv.build(p1, env_getter(env, 0), None, a),
            onednn_conv.build(p2, env_getter(env, 1), None, b)]  # fmt: skip
    links = [conv_chain.link_of(r) for r in runs]
    chain = conv_chain.Chain(links, env, [static_input, True, True])
    return chain, env, (p1, p2)


def _check(env: list, plans: tuple[ConvPlan, ConvPlan]) -> None:
    want = _want(plans[1], _want(plans[0], env[0]).float())
    np.testing.assert_allclose(env[2].numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("static_input", [True, False])
def test_hand_chain_new_tensors_and_layouts(static_input: bool, threads) -> None:
    threads(1)
    chain, env, plans = _hand_chain(static_input)
    for step in ("same", "in place", "new tensor", "nchw", "nchw", "channels-last"):
        if step == "in place":
            env[0].copy_(torch.from_numpy(RNG.standard_normal((1, 8, 7, 7)).astype(np.float32)))
        elif step != "same":
            x = torch.from_numpy(RNG.standard_normal((1, 8, 7, 7)).astype(np.float32))
            env[0] = x if step == "nchw" else x.contiguous(memory_format=CL)
        chain.run()
        _check(env, plans)


def test_hand_chain_another_thread_count(threads) -> None:
    chain, env, plans = _hand_chain(True)
    threads(1)
    chain.run()
    threads(2)
    env[0].copy_(torch.from_numpy(RNG.standard_normal((1, 8, 7, 7)).astype(np.float32)))
    chain.run()
    assert set(chain.teams) == {1, 2}
    _check(env, plans)
    chain.clock = iter(range(100)).__next__  # a clock ticking 1 a read
    chain.run()
    assert chain.seconds == [1, 1]


def test_hand_chain_later_member_input_turns_varying(threads) -> None:
    """A later member's slot given a tensor that needs a copy (NCHW) at run time: the chain
    reads it right before that member (member by member), with the right values."""
    threads(1)
    p1, p2 = _plan(8, 16, 7), _plan(16, 8, 7)
    a = torch.empty([1, 16, 7, 7]).contiguous(memory_format=CL)
    b = torch.empty([1, 8, 7, 7]).contiguous(memory_format=CL)
    x = torch.from_numpy(RNG.standard_normal((1, 8, 7, 7)).astype(np.float32))
    z = torch.from_numpy(RNG.standard_normal((1, 16, 7, 7)).astype(np.float32))
    env = [x.contiguous(memory_format=CL), a, b, z.contiguous(memory_format=CL)]
    runs = [onednn_conv.build(p1, env_getter(env, 0), None, a),
            onednn_conv.build(p2, env_getter(env, 3), None, b)]  # fmt: skip
    chain = conv_chain.Chain([conv_chain.link_of(r) for r in runs], env, [True] * 4)
    for layout in (CL, torch.contiguous_format, torch.contiguous_format):
        z = torch.from_numpy(RNG.standard_normal((1, 16, 7, 7)).astype(np.float32))
        env[3] = z.contiguous(memory_format=layout)
        chain.run()
        np.testing.assert_allclose(b.numpy(), _want(p2, env[3]).numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(a.numpy(), _want(p1, env[0]).numpy(), rtol=1e-4, atol=1e-4)
    assert chain.teams[1].late
