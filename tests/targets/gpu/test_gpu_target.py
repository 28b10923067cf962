"""The `gpu` target without a GPU: registration, the errors that name what is missing, and the
lowering decisions (attention recognition, the override hook), checked by running the GPU
lowering on the CPU (`GpuTarget(device="cpu")`) against numpy oracles."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets import KNOWN_TARGETS  # noqa: E402
from pygraphx.targets.gpu import GpuUnavailableError  # noqa: E402
from pygraphx.targets.gpu.target import GpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering.lower import LOWERINGS  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(7)
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention_model(kind: str, b: int = 2, h: int = 3, s: int = 5, e: int = 8):
    """Q K^T * c (+ mask | causal where + mask | exp instead of softmax) then softmax, then V;
    returns the model, its inputs and the numpy result."""
    q, k, v = (RNG.standard_normal((b, h, s, e)).astype(np.float32) for _ in range(3))
    mask = np.where(RNG.random((b, 1, 1, s)) < 0.3, -1e4, 0.0).astype(np.float32)
    scale = np.float32(1 / np.sqrt(e))
    feeds = {"q": q, "k": k, "v": v, "mask": mask}
    causal = np.tril(np.ones((s, s), bool))
    inits = {"scale": np.array(scale, np.float32), "perm_fill": np.array(-3.4e38, np.float32),
             "causal": causal}  # fmt: skip
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
    ]
    logits = (q @ k.transpose(0, 1, 3, 2)) * scale
    if kind == "causal":
        nodes.append(helper.make_node("Where", ["causal", "ss", "perm_fill"], ["sw"]))
        nodes.append(helper.make_node("Add", ["sw", "mask"], ["sm"]))
        logits = np.where(causal, logits, np.float32(-3.4e38)) + mask
    elif kind == "exp":  # not a softmax of the scores: must not become attention
        nodes.append(helper.make_node("Exp", ["ss"], ["sm"]))
        logits = np.exp(logits)
    else:
        nodes.append(helper.make_node("Add", ["ss", "mask"], ["sm"]))
        logits = logits + mask
    nodes += [
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["out"]),
    ]
    model = make_model(nodes, feeds, ["out"], inits)
    return model, feeds, softmax(logits.astype(np.float64)) @ v.astype(np.float64)


def compile_gpu_on_cpu(model, **settings) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(GpuTarget(device="cpu", **settings))
    return prog


def test_gpu_is_a_known_target() -> None:
    assert "gpu" in KNOWN_TARGETS
    assert GpuTarget(device="cpu").name == "gpu"


@no_gpu
def test_get_target_gpu_names_what_is_missing() -> None:
    with pytest.raises(GpuUnavailableError, match=r"no usable GPU.*torch\.cuda\.is_available"):
        pygraphx.get_target("gpu")


@no_gpu
def test_device_api_without_gpu_raises() -> None:
    with pytest.raises(GpuUnavailableError):
        pygraphx.to_gpu(np.zeros(3, np.float32))
    with pytest.raises(GpuUnavailableError):
        pygraphx.allocate_gpu(pygraphx.shape("float_type", [2, 3]))


@no_gpu
def test_driver_gpu_flag_reports_the_missing_device(capsys) -> None:
    from pygraphx.driver.main import main as driver_main

    rc = driver_main(["run", "--model", "mobilenetv2", "--gpu"])
    assert rc != 0
    assert "no usable GPU" in capsys.readouterr().err


def test_unknown_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown gpu target settings"):
        GpuTarget(devcie_id=1)
    with pytest.raises(ValueError, match="takes no settings"):
        pygraphx.get_target("ref", graph=False)


@pytest.mark.parametrize("kind", ["mask", "causal"])
def test_attention_is_recognised_and_exact(kind: str) -> None:
    model, feeds, want = attention_model(kind)
    prog = compile_gpu_on_cpu(model)
    assert prog._executable.attention_blocks == 1
    got = np.array(prog.run(feeds)[0])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_other_prologues_are_not_attention() -> None:
    model, feeds, want = attention_model("exp")
    prog = compile_gpu_on_cpu(model)
    assert prog._executable.attention_blocks == 0
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), want, rtol=1e-4, atol=1e-5)


def test_overrides_replace_fused_group_lowerings() -> None:
    """The hook the Triton generator plugs into: an override for `pointwise` is called for
    every fused group, and declining (False) falls back to the numpy compute."""
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    y = RNG.standard_normal((4, 6)).astype(np.float32)
    nodes = [
        helper.make_node("Add", ["x", "y"], ["a"]),
        helper.make_node("Mul", ["a", "a"], ["m"]),
        helper.make_node("Tanh", ["m"], ["out"]),
    ]
    model = make_model(nodes, {"x": x, "y": y}, ["out"])
    seen: list[str] = []

    def torch_eager(ctx, ins) -> bool:
        seen.append(ins.op.name)
        return LOWERINGS["pointwise"](ctx, ins)

    prog = compile_gpu_on_cpu(model, overrides={"pointwise": torch_eager})
    assert seen == ["pointwise"]
    np.testing.assert_allclose(np.array(prog.run({"x": x, "y": y})[0]), np.tanh((x + y) ** 2),
                               rtol=1e-6, atol=1e-6)  # fmt: skip
    declined = compile_gpu_on_cpu(model, overrides={"pointwise": lambda ctx, ins: False})
    assert declined._executable.fallbacks == {"pointwise": 1}
    np.testing.assert_allclose(np.array(declined.run({"x": x, "y": y})[0]),
                               np.tanh((x + y) ** 2), rtol=1e-6, atol=1e-6)  # fmt: skip


def test_cpu_device_runs_uncaptured_and_profiles() -> None:
    model, feeds, want = attention_model("mask")
    prog = compile_gpu_on_cpu(model)
    assert prog._executable.why_uncaptured == "graphs disabled"
    times: list[float] = []
    got = prog.run(feeds, observer=lambda ins, value, seconds: times.append(seconds))
    np.testing.assert_allclose(np.array(got[0]), want, rtol=1e-5, atol=1e-5)
    assert times and min(times) >= 0.0


def test_conv_model_matches_reference_on_cpu_lowering() -> None:
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    bias = RNG.standard_normal(4).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["out"]),
    ]
    model = make_model(nodes, {"x": x}, ["out"], {"w": w, "b": bias})
    ref = pygraphx.parse_onnx_buffer(model.SerializeToString())
    ref.compile(pygraphx.get_target("ref"))
    got = np.array(compile_gpu_on_cpu(model).run({"x": x})[0])
    np.testing.assert_allclose(got, np.array(ref.run({"x": x})[0]), rtol=1e-5, atol=1e-5)


def if_model():
    """relu(x) + 1 if c else -x (an If node: host control flow); model, inputs, numpy result."""
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "then", [], [out])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "else", [], [out])
    nodes = [
        helper.make_node("If", ["c"], ["r"], then_branch=then, else_branch=other),
        helper.make_node("Add", ["r", "one"], ["out"]),
    ]
    feeds = {"x": x, "c": np.array(True)}
    model = make_model(nodes, feeds, ["out"], {"one": np.array(1.0, np.float32)})
    return model, feeds, np.maximum(x, 0) + 1


def test_control_flow_runs_through_the_host_fallback() -> None:
    model, feeds, want = if_model()
    prog = compile_gpu_on_cpu(model)
    assert "if" in prog._executable.fallbacks
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), want, rtol=1e-6)


def test_scalar_inputs_stay_scalars() -> None:
    """0-d parameters reach the steps as 0-d tensors (ONNX node tests feed many)."""
    x, y = np.array(2.5, np.float32), np.array([1.0, -2.0, 3.0], np.float32)
    model = make_model([helper.make_node("Mul", ["x", "y"], ["out"])], {"x": x, "y": y}, ["out"])
    got = np.array(compile_gpu_on_cpu(model).run({"x": x, "y": y})[0])
    np.testing.assert_allclose(got, x * y)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_profile_counts_view_steps_of_fresh_tensors_as_no_device_time() -> None:
    """The attention's result is a new tensor each run, so the transpose after it is a step
    (a view made at run time): profiled, it counts 0 device time (it launches nothing; two
    events back to back would say ~1 us), while the attention and the add after the reshape
    count their kernels; the result still matches numpy."""
    model, feeds, _ = attention_model("mask")
    b, h, s, e = feeds["q"].shape
    bias = RNG.standard_normal(h * e).astype(np.float32)
    nodes = list(model.graph.node) + [
        helper.make_node("Transpose", ["out"], ["ot"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ot", "shape"], ["flat"]),
        helper.make_node("Add", ["flat", "bias"], ["y"]),
    ]
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    inits.update(shape=np.array([b, s, h * e], np.int64), bias=bias)
    prog = pygraphx.parse_onnx_buffer(make_model(nodes, feeds, ["y"], inits).SerializeToString())
    prog.compile(pygraphx.get_target("gpu"))
    seen: dict[str, list[float]] = {}
    got = prog.run(feeds, observer=lambda ins, v, sec: seen.setdefault(ins.op.name, []).append(sec))
    q, k, v = (feeds[n].astype(np.float64) for n in "qkv")
    att = softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(e) + feeds["mask"]) @ v
    want = att.transpose(0, 2, 1, 3).reshape(b, s, h * e) + bias
    np.testing.assert_allclose(np.array(got[0]), want, rtol=1e-4, atol=1e-4)
    assert seen["transpose"] and max(seen["transpose"]) == 0.0, seen
    assert max(seen["dot"]) > 0.0 and max(seen.get("pointwise", [0.0])) > 0.0, seen
