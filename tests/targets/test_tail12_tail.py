"""tail12: a CNN's last steps at batch 1 on several threads. The classifier's one-row product
calls oneDNN on its source's and a new result's addresses (`gemm_kernels.ClassifierKernel.
producer`, `LEAN_CLASSIFIER`), a global pooling runs on every thread of the run
(`scheduling.GLOBAL_POOL_ALL_THREADS`), and `onednn_linear.Linear` takes an implementation
name and column parts. Outputs against ONNX Runtime and numpy's float64 product."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu import scheduling  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import gemm_kernels, onednn_linear  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_capi import OneDnnError  # noqa: E402
from tests.helpers import make_model  # noqa: E402
from tests.targets.test_mnv2b1_classifier import cnn, run_counted  # noqa: E402

pytestmark = pytest.mark.skipif(
    not onednn_linear.available(), reason="needs oneDNN's C API library (onednn-cpu-gomp)"
)
RNG = np.random.default_rng(12)


def lean_calls(monkeypatch) -> list[bool]:
    """Record, for each classifier lowered, whether it got the lean producer."""
    made: list[bool] = []
    producer = gemm_kernels.ClassifierKernel.producer

    def recording(self, env, a, out_lens):  # noqa: ANN001
        got = producer(self, env, a, out_lens)
        made.append(got is not None)
        return got

    monkeypatch.setattr(gemm_kernels.ClassifierKernel, "producer", recording)
    return made


@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("pool", [True, False])
def test_lean_classifier_against_ort(monkeypatch, lean: bool, bias: bool, pool: bool):
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    monkeypatch.setattr(gemm_kernels, "LEAN_CLASSIFIER", lean)
    made = lean_calls(monkeypatch)
    model, x, want = cnn(bias, pool)
    got, kernels, calls = run_counted(model, x, 2, monkeypatch)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert kernels == [gemm_kernels.CLASSIFIER_KERNEL] and calls == 2
    assert made and set(made) == {lean}  # (asked once per lowering try)


def test_lean_classifier_returns_a_new_array_each_run(monkeypatch):
    """The product is the program's output, handed out without a copy: a later run must not
    write over an earlier run's result."""
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    made = lean_calls(monkeypatch)
    model, x, want = cnn()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=2))
    first = prog.run({"x": x})[0]
    x2 = RNG.standard_normal(x.shape).astype(np.float32)
    second = prog.run({"x": x2})[0]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(second, sess.run(None, {"x": x2})[0], rtol=1e-5, atol=1e-5)
    assert made and all(made)


def test_lean_classifier_on_one_thread_is_addmm(monkeypatch):
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    made = lean_calls(monkeypatch)
    model, x, want = cnn()
    got, _, calls = run_counted(model, x, 1, monkeypatch)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert made and all(made) and calls == 0  # (the producer's 1-thread branch: addmm)


@pytest.mark.parametrize("parts", [2, 4])
def test_classifier_in_column_parts_against_ort(monkeypatch, parts: int):
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    monkeypatch.setattr(gemm_kernels, "CLASSIFIER_PARTS", parts)
    model, x, want = cnn()
    got, _, calls = run_counted(model, x, 2, monkeypatch)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert calls == 2


@pytest.mark.parametrize("impl", ["gemm:jit", "brg"])
@pytest.mark.parametrize("parts", [1, 2])
def test_linear_implementation_matches_numpy(impl: str, parts: int):
    x = RNG.standard_normal((1, 96)).astype(np.float32)
    w = (RNG.standard_normal((96, 40)) / 10).astype(np.float32)
    b = RNG.standard_normal(40).astype(np.float32)
    lin = onednn_linear.Linear(torch.from_numpy(w), torch.from_numpy(b), 1, impl=impl, parts=parts)
    assert all(p.impl.startswith(impl) for p in lin.made.values())
    got = lin(torch.from_numpy(x)).reshape(1, 40).numpy()
    np.testing.assert_allclose(got, x.astype(np.float64) @ w + b, rtol=1e-5, atol=1e-5)


def test_linear_implementation_not_offered_is_an_error():
    w = torch.ones(8, 4)
    with pytest.raises(OneDnnError, match="not offered"):
        onednn_linear.Linear(w, None, 1, impl="no_such_impl")


def pool_model(global_pool: bool) -> tuple:
    x = RNG.standard_normal((1, 16, 8, 8)).astype(np.float32)
    w = (RNG.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32)
    if global_pool:
        pool = helper.make_node("GlobalAveragePool", ["c"], ["y"])
    else:
        pool = helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), pool]
    return make_model(nodes, {"x": x}, ["y"], {"w": w}), x


@pytest.mark.parametrize("rule", [True, False])
@pytest.mark.parametrize("global_pool", [True, False])
def test_global_pool_runs_on_every_thread(monkeypatch, rule: bool, global_pool: bool):
    """With the rule a global pooling's step gets the run's 2 threads; a small windowed one
    (and, without the rule, the global one) keeps the size rule's 1. Outputs against ORT."""
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    monkeypatch.setattr(scheduling, "GLOBAL_POOL_ALL_THREADS", rule)
    model, x = pool_model(global_pool)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=2))
    exe = prog._executable
    counts = [
        n for s, n in zip(exe.lowered.steps, exe.step_threads, strict=True)
        if any(i.op.name == "pooling" for i in s.instructions)
    ]  # fmt: skip
    assert counts == [2 if rule and global_pool else 1]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(
        prog.run({"x": x})[0], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5
    )
