"""The thread-safety contract (README "Threads and reliability"): `run` on one compiled program
from many threads gives exactly the serial results, a concurrent second `compile` waits and
fails clearly, and outputs never alias the caller's inputs (issue 16 cases 1 and 5)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from onnx import helper

import pygraphx
from pygraphx.ir.program import ProgramError
from tests.helpers import make_model

THREADS, RUNS = 8, 100


def _mlp() -> bytes:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 64)).astype(np.float32)
    b1 = rng.standard_normal(64).astype(np.float32)
    w2 = rng.standard_normal((64, 16)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["z"]),
        helper.make_node("Softmax", ["z"], ["y"], axis=-1),
    ]
    x = np.zeros((4, 32), np.float32)
    model = make_model(nodes, {"x": x}, ["y", "z"], {"w1": w1, "b1": b1, "w2": w2})
    return model.SerializeToString()


def _inputs(k: int) -> np.ndarray:
    return np.random.default_rng(1000 + k).standard_normal((4, 32)).astype(np.float32)


def _has_gpu() -> bool:
    torch = pytest.importorskip("torch")
    return bool(torch.cuda.is_available())


_GPU = pytest.param("gpu", marks=pytest.mark.skipif("not _has_gpu()", reason="needs a GPU"))


@pytest.mark.parametrize("target", ["ref", "cpu", _GPU])
def test_threads_match_serial_runs(target: str) -> None:
    prog = pygraphx.parse_onnx_buffer(_mlp())
    prog.compile(pygraphx.get_target(target))
    feeds = [_inputs(k) for k in range(THREADS * RUNS)]
    serial = [[np.array(o) for o in prog.run({"x": x})] for x in feeds]
    # independent oracle for the serial results: numpy
    oracle = pygraphx.parse_onnx_buffer(_mlp())
    oracle.compile(pygraphx.get_target("ref"))
    start = threading.Barrier(THREADS)

    def worker(t: int) -> list[list[np.ndarray]]:
        start.wait()
        return [[np.array(o) for o in prog.run({"x": feeds[t * RUNS + r]})] for r in range(RUNS)]

    with ThreadPoolExecutor(THREADS) as pool:
        results = [out for chunk in pool.map(worker, range(THREADS)) for out in chunk]
    for k, (got, want) in enumerate(zip(results, serial, strict=True)):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"run {k}")
    z = np.maximum(feeds[0] @ _weights()[0] + _weights()[1], 0) @ _weights()[2]
    np.testing.assert_allclose(serial[0][1], z, rtol=1e-4, atol=1e-4)


def _weights() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 64)).astype(np.float32)
    b1 = rng.standard_normal(64).astype(np.float32)
    w2 = rng.standard_normal((64, 16)).astype(np.float32)
    return w1, b1, w2


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_concurrent_compile_is_atomic(target: str) -> None:
    prog = pygraphx.parse_onnx_buffer(_mlp())
    start = threading.Barrier(2)

    def compile_once() -> str:
        start.wait()
        try:
            prog.compile(pygraphx.get_target(target))
        except ProgramError as exc:
            return str(exc)
        return "ok"

    with ThreadPoolExecutor(2) as pool:
        outcomes = sorted(pool.map(lambda _: compile_once(), range(2)))
    assert outcomes[0] == "ok"
    assert "already compiled" in outcomes[1]
    x = _inputs(0)
    w1, b1, w2 = _weights()
    np.testing.assert_allclose(
        np.array(prog.run({"x": x})[1]), np.maximum(x @ w1 + b1, 0) @ w2, rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("target", ["ref", "cpu"])
@pytest.mark.parametrize(
    "node",
    [
        helper.make_node("Identity", ["x"], ["y"]),
        helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0]),
        helper.make_node("Flatten", ["x"], ["y"], axis=0),
    ],
    ids=lambda n: n.op_type,
)
def test_outputs_do_not_alias_inputs(target: str, node) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    model = make_model([node], {"x": x}, ["y"])
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target(target))
    (out,) = prog.run({"x": x})
    want = np.array(out).copy()
    x[...] = -1.0  # the caller changes its input after the run
    np.testing.assert_array_equal(np.array(out), want)
    assert np.array(out).flags.writeable


def test_literal_output_is_owned_by_the_caller() -> None:
    w = np.arange(4, dtype=np.float32)
    model = make_model(
        [helper.make_node("Identity", ["w"], ["y"]), helper.make_node("Neg", ["x"], ["z"])],
        {"x": w},
        ["y", "z"],
        {"w": w},
    )
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("ref"))
    first = prog.run({"x": w})[0].array
    first[0] = 99.0  # writing into one result must not change the program
    np.testing.assert_array_equal(np.array(prog.run({"x": w})[0]), w)
