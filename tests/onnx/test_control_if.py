"""ONNX If as program sub-modules (one per branch), checked against ONNX Runtime: run-time and
constant conditions, the printed form, and the branches it refuses.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from pygraphx.onnx.errors import OnnxParseError
from tests.onnx.control_flow_models import (
    B,
    F,
    branch_model,
    check,
    const,
    if_model,
    parse,
    vi,
)

# --- If ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cond", [True, False])
def test_if_with_runtime_condition_reads_outer_values(cond: bool) -> None:
    rng = np.random.default_rng(0)
    feeds = {
        "c": np.array(cond),
        "x": rng.standard_normal((2, 3)).astype(np.float32),
        "w": rng.standard_normal((2, 3)).astype(np.float32),
    }
    check(branch_model(), feeds)


def test_if_prints_its_branches_as_sub_modules_after_main() -> None:
    prog = parse(branch_model())
    text = str(prog)
    assert "if[output=0](c,x,main:@" in text
    assert ", [main:if0_then, main:if0_else] -> float_type, {2, 3}" in text
    order = [line for line in text.splitlines() if line.startswith("module:")]
    assert order == ['module: "main"', 'module: "main:if0_then"', 'module: "main:if0_else"']
    # the branch reads x and the main-module value h by their main names
    then = text.split('module: "main:if0_then"')[1].split("module:")[0]
    assert "add(x,main:@" in then
    prog.validate()


def test_if_with_constant_condition_parses_only_the_taken_branch() -> None:
    # the branches differ in shape, which only a compile-time condition allows
    model = if_model(
        [helper.make_node("Transpose", ["x"], ["t0"])],
        ["t0"],
        [helper.make_node("Relu", ["x"], ["e0"])],
        ["e0"],
        inits={"c": np.array(True)},
    )
    model.graph.input.remove(next(i for i in model.graph.input if i.name == "c"))
    prog = parse(model)
    assert list(prog.modules) == ["main"]
    assert "transpose" in str(prog)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    check(model, {"x": x, "w": x})


def test_if_with_branches_of_different_shapes_is_refused() -> None:
    model = if_model(
        [helper.make_node("Transpose", ["x"], ["t0"])],
        ["t0"],
        [helper.make_node("Relu", ["x"], ["e0"])],
        ["e0"],
    )
    with pytest.raises(
        OnnxParseError,
        match=r"'if1'.*then_branch gives float_type \[3, 2\], "
        r"else_branch gives float_type \[2, 3\].*run-time value",
    ):
        parse(model)


def test_if_without_a_bool_condition_is_refused() -> None:
    then_g = helper.make_graph([const("a", np.ones(2, np.float32))], "t", [], [vi("a")])
    node = helper.make_node("If", ["c"], ["y"], name="if1", then_branch=then_g, else_branch=then_g)
    graph = helper.make_graph([node], "g", [vi("c", B, [2])], [vi("y", F, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxParseError, match="condition must be one bool_type value"):
        parse(model)
