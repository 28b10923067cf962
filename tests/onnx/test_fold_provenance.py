"""Rewrites that fold instructions into a new one (outside fusion) keep every folded node.

A rule of `simplify_algebra` / `recognize_activations` replacing a matched pattern by a new
instruction gives it the node labels of the instructions it makes dead (`folded_sources`): a
MatMul scaled by a constant vector becomes one `dot` naming the MatMul and the Mul, a spelled-out
GELU one `gelu` naming its five nodes, Q/K projections one `dot` naming both. A run-time error
in such an instruction then names them all, on `ref` and `cpu`. ONNX Runtime checks the models
are sound."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper

import pygraphx
from pygraphx.passes.pipeline import optimize
from tests.helpers import assert_outputs_match, make_model, plant_cpu_step_failure, run_ort

X = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)


def _scaled_matmul() -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"], name="proj"),
        helper.make_node("Mul", ["p", "s"], ["y"], name="proj/scale"),
    ]
    inits = {"w": W, "s": np.array([0.5, 2.0, -1.0], np.float32)}
    return make_model(nodes, {"x": X}, ["y"], inits)


def _spelled_gelu() -> onnx.ModelProto:
    """x * 0.5 * (1 + erf(x * sqrt(1/2))), node by node."""
    nodes = [
        helper.make_node("Mul", ["x", "r"], ["a"], name="g/scale"),
        helper.make_node("Erf", ["a"], ["e"], name="g/erf"),
        helper.make_node("Add", ["e", "one"], ["b"], name="g/add"),
        helper.make_node("Mul", ["x", "half"], ["h"], name="g/half"),
        helper.make_node("Mul", ["h", "b"], ["y"], name="g/out"),
    ]
    inits = {
        "r": np.float32(math.sqrt(0.5)),
        "one": np.float32(1.0),
        "half": np.float32(0.5),
    }
    return make_model(nodes, {"x": X}, ["y"], inits)


def _two_projections() -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="attn/q"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="attn/k"),
        helper.make_node("Add", ["q", "k"], ["y"], name="attn/sum"),
    ]
    return make_model(nodes, {"x": X}, ["y"], {"wq": W, "wk": W[:, ::-1].copy()})


SCALED = ("'proj' MatMul", "'proj/scale' Mul")
GELU = ("'g/scale' Mul", "'g/erf' Erf", "'g/add' Add", "'g/half' Mul", "'g/out' Mul")
PROJECTIONS = ("'attn/q' MatMul", "'attn/k' MatMul")


@pytest.mark.parametrize(
    "build,op_name,labels",
    [(_scaled_matmul, "dot", SCALED), (_spelled_gelu, "gelu", GELU),
     (_two_projections, "dot", PROJECTIONS)],
    ids=["dot_mul", "gelu", "horizontal_dots"],
)  # fmt: skip
def test_folded_instruction_names_every_node(build, op_name: str, labels: tuple) -> None:
    model = build()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    optimize(prog)
    found = [i for i in prog.get_main_module().instructions if _computes(i, op_name)]
    assert len(found) == 1, [str(i.op) for i in prog.get_main_module().instructions]
    assert set(found[0].source) == set(labels), found[0].source
    prog.compile(pygraphx.get_target("ref"))  # the rewrite kept the values (ORT's)
    assert_outputs_match([np.array(prog.run({"x": X})[0])], run_ort(model, {"x": X}), 1e-5, 1e-5)


def _computes(ins: object, op_name: str) -> bool:
    """`ins` is an `op_name`, or a fused instruction whose body holds one (the fused
    instruction lists its members' nodes; the body's instructions know none)."""
    bodies = [b.instructions for b in ins.module_inputs]
    return ins.op.name == op_name or any(i.op.name == op_name for b in bodies for i in b)


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_run_error_in_a_folded_dot_names_both_nodes(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prog = pygraphx.parse_onnx_buffer(_scaled_matmul().SerializeToString())
    if target == "ref":
        optimize(prog)  # ref runs no passes of its own
    prog.compile(pygraphx.get_target(target))
    if target == "cpu":
        plant_cpu_step_failure(prog, "dot")
    else:
        dot = next(i for i in prog.get_main_module().instructions if i.op.name == "dot")

        def broken(self: object, shape: object, args: object) -> None:
            raise ZeroDivisionError("planted")

        monkeypatch.setattr(type(dot.op), "compute", broken)
    with pytest.raises(pygraphx.EvaluationError, match="planted") as err:
        prog.run({"x": X})
    message = str(err.value)
    assert message.endswith("(ONNX nodes " + ", ".join(SCALED) + ")"), message


def test_run_error_in_a_recognised_gelu_names_its_nodes() -> None:
    """On cpu the gelu runs in a fused pointwise step: the step names all five nodes."""
    prog = pygraphx.parse_onnx_buffer(_spelled_gelu().SerializeToString())
    prog.compile(pygraphx.get_target("cpu"))
    plant_cpu_step_failure(prog, prog._executable.executor.computes[-1][-1].op.name)
    with pytest.raises(pygraphx.EvaluationError, match="planted") as err:
        prog.run({"x": X})
    message = str(err.value)
    assert all(label in message for label in GELU), message


def test_fold_qdq_names_the_dequantised_inputs() -> None:
    """x_dq @ w_dq -> dequantizelinear(quant_dot(x, w)): both name the DequantizeLinear nodes
    and the MatMul (the values against the float product of the dequantised operands)."""
    from pygraphx.ir.instruction import node_source
    from pygraphx.ops import make_op
    from pygraphx.passes.fold_qdq import fold_qdq

    rng = np.random.default_rng(5)
    w = rng.integers(-127, 128, size=(4, 3)).astype(np.int8)
    x = rng.integers(-128, 128, size=(2, 4)).astype(np.int8)
    prog = pygraphx.Program()
    m = prog.get_main_module()
    xp = m.add_parameter("x", pygraphx.Shape("int8_type", [2, 4]))
    labels = ("'x/dq' DequantizeLinear", "'w/dq' DequantizeLinear", "'mm' MatMul")
    with node_source(labels[:1]):
        a = m.add_instruction(
            make_op("dequantizelinear"),
            [xp, m.add_literal(np.full((2, 4), 0.5, np.float32)),
             m.add_literal(np.zeros((2, 4), np.int8))],
        )  # fmt: skip
    with node_source(labels[1:2]):
        b = m.add_instruction(
            make_op("dequantizelinear"),
            [m.add_literal(w), m.add_literal(np.full((4, 3), 0.25, np.float32)),
             m.add_literal(np.zeros((4, 3), np.int8))],
        )  # fmt: skip
    with node_source(labels[2:]):
        m.add_return([m.add_instruction(make_op("dot"), [a, b])])
    fold_qdq(m)
    made = {i.op.name: i for i in m.instructions}
    assert "dot" not in made
    for name in ("quant_dot", "dequantizelinear"):
        assert set(made[name].source) == set(labels), (name, made[name].source)
    prog.compile(pygraphx.get_target("ref"))
    want = (x.astype(np.float32) * 0.5) @ (w.astype(np.float32) * 0.25)
    np.testing.assert_allclose(np.array(prog.run({"x": x})[0]), want, rtol=1e-6)
