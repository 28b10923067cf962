"""Compile-time resource bounds (issue 16 case 3): constant folding skips values above
`PGX_CONST_FOLD_LIMIT` that its inputs do not already hold, and deep graphs parse and compile
without recursion (explicit stacks)."""

from __future__ import annotations

import sys
import time
import tracemalloc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import pygraphx
from pygraphx.passes.pipeline import optimize
from tests.helpers import make_model


def _huge_constant_model(n: int) -> bytes:
    shape = numpy_helper.from_array(np.array([n, n], np.int64), "shape")
    nodes = [
        helper.make_node(
            "ConstantOfShape",
            ["shape"],
            ["c"],
            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5]),
        ),
        helper.make_node("Mul", ["c", "c"], ["m"]),
        helper.make_node("ReduceSum", ["m"], ["s"], keepdims=0),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    x = np.zeros(3, np.float32)
    model = make_model(nodes, {"x": x}, ["y"], {})
    model.graph.initializer.append(shape)
    return model.SerializeToString()


def _literal_bytes(prog: pygraphx.Program) -> int:
    main = prog.get_main_module()
    return max(i.get_literal().array.nbytes for i in main.instructions if i.is_literal())


def test_huge_constant_is_not_folded() -> None:
    prog = pygraphx.parse_onnx_buffer(_huge_constant_model(100_000))  # 37 GiB if folded
    tracemalloc.start()
    try:
        with pytest.warns(UserWarning, match="PGX_CONST_FOLD_LIMIT"):
            optimize(prog)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
    assert _literal_bytes(prog) < 1 << 20


def test_fold_limit_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.arange(3, dtype=np.float32)
    want = x + 300 * 300 * 0.25  # numpy oracle: sum of 0.5 * 0.5 over [300, 300]
    folded = pygraphx.parse_onnx_buffer(_huge_constant_model(300))
    optimize(folded)
    assert _literal_bytes(folded) < 64  # the sum became one small literal
    monkeypatch.setenv("PGX_CONST_FOLD_LIMIT", "1000")
    bounded = pygraphx.parse_onnx_buffer(_huge_constant_model(300))
    with pytest.warns(UserWarning, match="left to run time"):
        optimize(bounded)
    for prog in (folded, bounded):
        prog.compile(pygraphx.get_target("cpu"))
        np.testing.assert_allclose(np.array(prog.run({"x": x})[0]), want, rtol=1e-6)


def test_bad_fold_limit_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGX_CONST_FOLD_LIMIT", "lots")
    with pytest.raises(ValueError, match="PGX_CONST_FOLD_LIMIT='lots'"):
        optimize(pygraphx.parse_onnx_buffer(_huge_constant_model(4)))


def _chained_shape_model(depth: int) -> bytes:
    """A Reshape whose shape is [2, 3] + depth constant Adds of [0, 0] (then [6] * ... )."""
    nodes = []
    name = "s0"
    for k in range(depth):
        nodes.append(helper.make_node("Add", [name, "zero"], [f"s{k + 1}"]))
        name = f"s{k + 1}"
    nodes.append(helper.make_node("Reshape", ["x", name], ["r"]))
    nodes.append(helper.make_node("Relu", ["r"], ["y"]))
    x = np.zeros(6, np.float32)
    inits = {"s0": np.array([2, 3], np.int64), "zero": np.array([0, 0], np.int64)}
    return make_model(nodes, {"x": x}, ["y"], inits).SerializeToString()


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_deep_constant_chain_without_recursion(target: str) -> None:
    depth = 3 * sys.getrecursionlimit()
    prog = pygraphx.parse_onnx_buffer(_chained_shape_model(depth))
    prog.compile(pygraphx.get_target(target))
    x = np.arange(-3, 3, dtype=np.float32)
    np.testing.assert_array_equal(np.array(prog.run({"x": x})[0]), np.maximum(x, 0).reshape(2, 3))


def _relu_chain(n: int) -> bytes:
    nodes = [helper.make_node("Relu", [f"v{k}"], [f"v{k + 1}"]) for k in range(n)]
    nodes[0].input[0] = "x"
    nodes[-1].output[0] = "y"
    return make_model(nodes, {"x": np.zeros((4, 8), np.float32)}, ["y"]).SerializeToString()


def _compile_seconds(n: int, target: str) -> float:
    prog = pygraphx.parse_onnx_buffer(_relu_chain(n))
    start = time.perf_counter()
    prog.compile(pygraphx.get_target(target))
    seconds = time.perf_counter() - start
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(np.array(prog.run({"x": x})[0]), np.maximum(x, 0))
    return seconds


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_compile_time_linear_in_nodes(target: str) -> None:
    if target == "cpu":
        pytest.importorskip("torch")
    # best of three each: one compile stalled by a neighbour's burst must not fail the test
    small = min(_compile_seconds(250, target) for _ in range(3))
    large = min(_compile_seconds(2000, target) for _ in range(3))
    # 8x the nodes: linear is 8x; allow 3x slack for noise on a shared machine (cubic: 512x)
    assert large < 24 * small + 0.5, (small, large)
