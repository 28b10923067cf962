"""What the control-flow tests (test_control_*.py, test_control_flow.py) share: If and Loop
models, their value infos and constants, parsing, and the check of pygraphx (each target)
against ONNX Runtime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import pygraphx
from pygraphx.ir.program import Program
from tests.helpers import assert_outputs_match, make_model, run_ort, run_pgx

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def vi(name: str, elem: int = F, shape: Sequence[int | str] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))


def check(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    targets: Sequence[str] = ("ref", "cpu"),
    **parse: object,
) -> list[np.ndarray]:
    """pygraphx (each target) against ONNX Runtime."""
    ref = run_ort(model, feeds)
    ours = []
    for target in targets:
        ours = run_pgx(model, feeds, target=target, **parse)
        assert_outputs_match(ours, ref, rtol=1e-5, atol=1e-6)
    return ours


def parse(model: onnx.ModelProto, **options: object) -> Program:
    return pygraphx.parse_onnx_buffer(model.SerializeToString(), **options)


def if_model(then_nodes, then_out, else_nodes, else_out, extra=(), inits=None, opset=17):
    then_g = helper.make_graph(then_nodes, "then_body", [], [vi(o, F, None) for o in then_out])
    else_g = helper.make_graph(else_nodes, "else_body", [], [vi(o, F, None) for o in else_out])
    node = helper.make_node(
        "If",
        ["c"],
        [f"y{k}" for k in range(len(then_out))],
        name="if1",
        then_branch=then_g,
        else_branch=else_g,
    )
    inputs = {
        "c": np.array(True),
        "x": np.zeros((2, 3), np.float32),
        "w": np.zeros((2, 3), np.float32),
    }
    return make_model([*extra, node], inputs, [f"y{k}" for k in range(len(then_out))], inits, opset)


def branch_model() -> onnx.ModelProto:
    # both branches read outer values (x from the graph, h computed in main)
    return if_model(
        [
            helper.make_node("Add", ["x", "h"], ["t0"]),
            helper.make_node("Relu", ["t0"], ["t1"]),
            helper.make_node("Identity", ["x"], ["t2"]),
        ],
        ["t1", "t2"],
        [helper.make_node("Mul", ["h", "w"], ["e0"]), helper.make_node("Neg", ["x"], ["e1"])],
        ["e0", "e1"],
        extra=[helper.make_node("Sigmoid", ["w"], ["h"])],
    )


def loop_body(
    nodes, carried=(("s_in", "s_out", F, [2]),), scans=(("scan", F, [2]),), cond_out="cond_in"
) -> onnx.GraphProto:
    inputs = [vi("i", I64, []), vi("cond_in", B, [])] + [vi(a, t, s) for a, _, t, s in carried]
    outputs = [vi(cond_out, B, [])] + [vi(b, t, s) for _, b, t, s in carried]
    outputs += [vi(n, t, s) for n, t, s in scans]
    nodes = list(nodes)
    if cond_out == "cond_in":
        outputs[0] = vi("cond_out", B, [])
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    return helper.make_graph(nodes, "loop_body", inputs, outputs)


def accumulate_body() -> onnx.GraphProto:
    # s_out = s_in + x * i;  scan = s_out * w  (x, w: outer values)
    return loop_body(
        [
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Mul", ["x", "fi"], ["xi"]),
            helper.make_node("Add", ["s_in", "xi"], ["s_out"]),
            helper.make_node("Mul", ["s_out", "w"], ["scan"]),
        ]
    )


def loop_model(body, m="M", cond="c", inits=None, n_out=2, outputs=None, feeds=None):
    node = helper.make_node(
        "Loop", [m, cond, "s0"], outputs or ["s_final", "scans"][:n_out], name="loop1", body=body
    )
    feeds = feeds or {
        "s0": np.zeros(2, np.float32),
        "x": np.ones(2, np.float32),
        "w": np.ones(2, np.float32),
    }
    return make_model([node], feeds, outputs or ["s_final", "scans"][:n_out], inits)
