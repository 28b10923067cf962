"""The `cpu` target against the `ref` target: the model builders and comparisons that the
tests of tests/targets/test_cpu_*.py share (ONNX models compiled for both targets, outputs
matched in dtype, shape and value)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper

import pygraphx
from pygraphx.ir.program import Program
from tests.helpers import make_model

RNG = np.random.default_rng(0)


def f32(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def ints(*shape: int, lo: int = -5, hi: int = 6, dtype: Any = np.int64) -> np.ndarray:
    return RNG.integers(lo, hi, shape).astype(dtype)


def compile_both(model: onnx.ModelProto) -> tuple[Program, Program]:
    data = model.SerializeToString()
    ref = pygraphx.parse_onnx_buffer(data)
    ref.compile(pygraphx.get_target("ref"))
    cpu = pygraphx.parse_onnx_buffer(data)
    cpu.compile(pygraphx.get_target("cpu"))
    return ref, cpu


def compare(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> Program:
    """Run `model` on ref and cpu; every output must match in dtype, shape and value."""
    ref, cpu = compile_both(model)
    want = [np.array(a) for a in ref.run(dict(feeds))]
    got = [np.array(a) for a in cpu.run(dict(feeds))]
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == b.dtype, f"output {k}: dtype {a.dtype}, expected {b.dtype}"
        assert a.shape == b.shape, f"output {k}: shape {a.shape}, expected {b.shape}"
        if a.dtype.kind in "biu":
            np.testing.assert_array_equal(a, b, err_msg=f"output {k}")
        else:
            np.testing.assert_allclose(
                a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol,
                err_msg=f"output {k}",
            )  # fmt: skip
    return cpu


def node_model(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    initializers: Mapping[str, np.ndarray] | None = None,
    num_outputs: int = 1,
    opset: int = 17,
) -> onnx.ModelProto:
    names = list(inputs) + list(initializers or {})
    outs = [f"out{k}" for k in range(num_outputs)]
    node = helper.make_node(op_type, names, outs, **(attrs or {}))
    return make_model([node], inputs, outs, initializers, opset)


def check(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    initializers: Mapping[str, np.ndarray] | None = None,
    num_outputs: int = 1,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    opset: int = 17,
) -> Program:
    model = node_model(op_type, inputs, attrs, initializers, num_outputs, opset)
    return compare(model, inputs, rtol, atol)


def _conv_net(act: str, residual: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """conv(+bias) -> [add residual] -> act, the shapes a CNN block has."""
    c = 8
    inits = {"w1": f32(c, 4, 3, 3), "b1": f32(c), "w2": f32(c, c, 1, 1), "b2": f32(c),
             "w3": f32(c, 4, 1, 1), "b3": f32(c), "lo": np.float32(0.0),
             "hi": np.float32(0.5)}  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
    ]
    last = "c2"
    if residual == "identity":
        nodes.append(helper.make_node("Add", ["c2", "r1"], ["s"]))
        last = "s"
    elif residual == "conv":
        nodes.append(helper.make_node("Conv", ["x", "w3", "b3"], ["c3"]))
        nodes.append(helper.make_node("Add", ["c2", "c3"], ["s"]))
        last = "s"
    if act == "relu":
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    elif act == "clip":
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    feeds = {"x": f32(2, 4, 6, 6)}
    return make_model(nodes, feeds, ["y"], inits), feeds


def assert_profile_matches(prog: Program, feeds: Mapping[str, np.ndarray]) -> None:
    """The profiled (unfused) run reports every instruction and gives the same outputs."""
    seen: list[Any] = []
    fast = [np.array(a) for a in prog.run(dict(feeds))]
    slow = [np.array(a) for a in prog.run(dict(feeds), observer=lambda i, v, t: seen.append(
        (i, v, t)))]  # fmt: skip
    main = prog.get_main_module()
    assert [i for i, _, _ in seen] == [i for i in main.instructions if not i.is_return()]
    assert all(t >= 0 for _, _, t in seen)
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    for ins, value, _ in seen:
        assert value is not None and list(np.shape(value)) == ins.shape.lens()
