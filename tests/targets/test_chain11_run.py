"""The cpu target's per-run work outside the steps: parameters bound the direct way (and the
general way for read-only, reversed or non-contiguous arrays), outputs taken as fresh arrays no
later run overwrites, the budget's release with and without a waiting run. Against ONNX
Runtime."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.cpu.threads import ThreadBudget  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(12)


def _model(dtype: type = np.float32) -> tuple[object, object]:
    """y = relu(x) * 2 and z = x + 1: two outputs (one fused pointwise step each)."""
    x = RNG.standard_normal((3, 5)).astype(dtype)
    two, one = np.array(2, dtype=dtype), np.array(1, dtype=dtype)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Mul", ["r", "two"], ["y"]),
        helper.make_node("Add", ["x", "one"], ["z"]),
    ]
    model = make_model(nodes, {"x": x}, ["y", "z"], {"two": two, "one": one})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    return prog, sess


def _inputs(dtype: type) -> dict[str, np.ndarray]:
    base = RNG.standard_normal((6, 10)).astype(dtype)
    readonly = RNG.standard_normal((3, 5)).astype(dtype)
    readonly.flags.writeable = False
    return {
        "dense": RNG.standard_normal((3, 5)).astype(dtype),
        "readonly": readonly,
        "reversed": base[:3, :5][::-1],
        "strided": base[::2, ::2],
        "fortran": np.asfortranarray(RNG.standard_normal((3, 5)).astype(dtype)),
    }


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_inputs_of_every_layout_against_ort(dtype: type) -> None:
    prog, sess = _model(dtype)
    tol = 1e-2 if dtype == np.float16 else 1e-6
    for name, x in _inputs(dtype).items():
        got = [np.array(o) for o in prog.run({"x": x})]
        want = sess.run(None, {"x": np.ascontiguousarray(x)})
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=name)


def test_outputs_are_not_overwritten_by_later_runs() -> None:
    prog, sess = _model()
    xs = [RNG.standard_normal((3, 5)).astype(np.float32) for _ in range(3)]
    kept = [prog.run({"x": x}) for x in xs]
    for x, outs in zip(xs, kept, strict=True):
        for g, w in zip(outs, sess.run(None, {"x": x}), strict=True):
            np.testing.assert_allclose(np.array(g), w, rtol=1e-6, atol=1e-6)


def test_budget_release_wakes_a_waiting_run() -> None:
    budget = ThreadBudget(2)
    assert budget.acquire(2) == 2
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(budget.acquire(2)))
    waiter.start()
    for _ in range(200):  # until it waits
        if budget.waiting:
            break
        time.sleep(0.01)
    assert budget.waiting == 1 and not got
    budget.release()
    waiter.join(5)
    assert got == [2] and budget.waiting == 0 and budget.holders == 1
