"""ONNX control flow (If, Loop, Scan) across the compiler: errors that name the node and the
sub-graph, dead-code elimination that keeps values only sub-modules read, save/load round
trips, the optimisation passes and the cpu target (which runs them over the bodies). Each
operator on its own: test_control_if.py, test_control_loop.py, test_control_scan.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import pygraphx
from pygraphx.ir.program import Program
from pygraphx.onnx.errors import OnnxParseError, UnsupportedOperatorError
from pygraphx.ops import make_op
from pygraphx.ops.control import If
from pygraphx.passes.dead_code_elimination import dead_code_elimination
from tests.helpers import assert_outputs_match, make_model, run_ort
from tests.onnx.control_flow_models import (
    F,
    accumulate_body,
    branch_model,
    check,
    if_model,
    loop_body,
    loop_model,
    parse,
    vi,
)

# --- errors inside sub-graphs -----------------------------------------------------------------


def test_unsupported_op_in_a_sub_graph_names_the_sub_graph() -> None:
    body = loop_body([helper.make_node("FooBar", ["s_in"], ["s_out"], name="foo")], scans=())
    model = loop_model(body, n_out=1, inits={"M": np.array(2, np.int64), "c": np.array(True)})
    with pytest.raises(UnsupportedOperatorError, match=r"FooBar.*foo \(in body of Loop 'loop1'\)"):
        parse(model)


def test_handler_error_in_a_branch_names_node_and_branch() -> None:
    model = if_model(
        [helper.make_node("Reshape", ["x", "shape"], ["t0"], name="bad_reshape")],
        ["t0"],
        [helper.make_node("Relu", ["x"], ["e0"])],
        ["e0"],
        inits={"shape": np.array([4, 4], np.int64)},
    )
    with pytest.raises(OnnxParseError, match=r"'bad_reshape'.*\(in then_branch of node 'if1'"):
        parse(model)


# --- dead code, save/load, targets ------------------------------------------------------------


def test_dead_code_elimination_keeps_values_only_a_body_reads() -> None:
    # built by hand, MIGraphX-style: the `if` lists only its condition, the branches read h
    prog = Program()
    main = prog.get_main_module()
    s = pygraphx.Shape("float_type", [2])
    c = main.add_parameter("c", pygraphx.Shape("bool_type", []))
    a = main.add_parameter("a", s)
    h = main.add_instruction(make_op("add"), [a, a])  # read only by the branches
    dead = main.add_instruction(make_op("add"), [h, a])
    then = prog.create_module("main:if0_then", main)
    then.add_return([then.add_instruction(make_op("add"), [h, h])])
    other = prog.create_module("main:if0_else", main)
    other.add_return([other.add_instruction(make_op("mul"), [h, h])])
    y = main.add_instruction(If(), [c], [then, other])
    main.add_return([y])
    dead_code_elimination(main)
    assert h in main.instructions and dead not in main.instructions
    prog.validate()
    prog.compile(pygraphx.get_target("ref"))
    x = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(np.array(prog.run({"c": np.array(True), "a": x})[0]), 4 * x)
    np.testing.assert_array_equal(np.array(prog.run({"c": np.array(False), "a": x})[0]), 4 * x * x)


def test_dead_control_flow_takes_its_bodies_and_their_inputs_along() -> None:
    model = branch_model()
    # y1 only: the If output 0 and everything only it needs go
    model.graph.output.pop(0)
    prog = parse(model)
    assert sum(1 for i in prog.get_main_module() if i.op.name == "if") == 1
    prog.validate()
    x = np.ones((2, 3), np.float32)
    check(model, {"c": np.array(False), "x": x, "w": x})
    # a whole dead Loop: its body leaves the program too
    dead_loop = loop_model(
        accumulate_body(), inits={"M": np.array(2, np.int64), "c": np.array(True)}
    )
    dead_loop.graph.node.append(helper.make_node("Relu", ["s0"], ["r"]))
    del dead_loop.graph.output[:]
    dead_loop.graph.output.append(vi("r", F, [2]))
    assert list(parse(dead_loop).modules) == ["main"]


def test_save_load_round_trip_with_if_and_loop(tmp_path) -> None:
    # an If inside a Loop body, and an If in main
    then_g = helper.make_graph([helper.make_node("Add", ["s_in", "x"], ["a"])], "t", [], [vi("a")])
    else_g = helper.make_graph([helper.make_node("Sub", ["s_in", "x"], ["b"])], "e", [], [vi("b")])
    body = loop_body(
        [
            helper.make_node("If", ["c"], ["s_out"], then_branch=then_g, else_branch=else_g),
            helper.make_node("Mul", ["s_out", "w"], ["scan"]),
        ]
    )
    loop = helper.make_node("Loop", ["M", "", "s0"], ["s", "ys"], body=body)
    t2 = helper.make_graph([helper.make_node("Neg", ["s"], ["n"])], "t2", [], [vi("n")])
    e2 = helper.make_graph([helper.make_node("Abs", ["s"], ["p"])], "e2", [], [vi("p")])
    top_if = helper.make_node("If", ["c"], ["z"], then_branch=t2, else_branch=e2)
    feeds = {
        "c": np.array(True),
        "s0": np.ones(2, np.float32),
        "x": np.array([1.0, 2.0], np.float32),
        "w": np.array([3.0, -1.0], np.float32),
    }
    model = make_model([loop, top_if], feeds, ["ys", "z"], {"M": np.array(3, np.int64)})
    for c in (True, False):
        check(model, {**feeds, "c": np.array(c)})
    prog = parse(model)
    path = tmp_path / "cf.pgx"
    pygraphx.save(prog, path)
    loaded = pygraphx.load(path)
    assert str(loaded) == str(prog)
    assert list(loaded.modules) == list(prog.modules)
    loaded.validate()
    for p in (prog, loaded):
        p.compile(pygraphx.get_target("ref"))
    for c in (True, False):
        f = {**feeds, "c": np.array(c)}
        for a, b in zip(prog.run(f), loaded.run(f), strict=True):
            np.testing.assert_array_equal(np.array(a), np.array(b))
    # a compiled program round-trips as well
    compiled = parse(model)
    compiled.compile(pygraphx.get_target("cpu"))
    pygraphx.save(compiled, tmp_path / "cf_cpu.pgx")
    back = pygraphx.load(tmp_path / "cf_cpu.pgx")
    for a, b in zip(compiled.run(feeds), back.run(feeds), strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b))


def test_outer_value_used_in_main_and_in_a_body_stays_alive() -> None:
    # h feeds a main instruction before the If and the branch after it: neither the
    # evaluator's release of dead values nor the cpu target's memory plan may drop it early
    model = if_model(
        [helper.make_node("Add", ["h", "x"], ["t0"])],
        ["t0"],
        [helper.make_node("Sub", ["h", "x"], ["e0"])],
        ["e0"],
        extra=[
            helper.make_node("Exp", ["w"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Mul", ["r", "w"], ["x2"]),
        ],
    )
    model.graph.output.append(vi("x2", F, [2, 3]))
    rng = np.random.default_rng(7)
    for c in (True, False):
        feeds = {
            "c": np.array(c),
            "x": rng.standard_normal((2, 3)).astype(np.float32),
            "w": rng.standard_normal((2, 3)).astype(np.float32),
        }
        check(model, feeds)


def test_optimised_program_with_loop_matches_ref() -> None:
    model = loop_model(accumulate_body(), inits={"M": np.array(6, np.int64), "c": np.array(True)})
    rng = np.random.default_rng(2)
    feeds = {k: rng.standard_normal(2).astype(np.float32) for k in ("s0", "x", "w")}
    prog = pygraphx.optimize(parse(model))
    prog.validate()
    prog.compile(pygraphx.get_target("ref"))
    ours = [np.array(r) for r in prog.run(feeds)]
    assert_outputs_match(ours, run_ort(model, feeds), rtol=1e-5, atol=1e-6)


def test_cpu_target_schedules_bodies() -> None:
    model = loop_model(accumulate_body(), inits={"M": np.array(3, np.int64), "c": np.array(True)})
    feeds = {k: np.ones(2, np.float32) for k in ("s0", "x", "w")}
    check(model, feeds, targets=("cpu",))


def test_a_multi_output_loop_runs_its_body_once_per_evaluation(monkeypatch) -> None:
    from pygraphx.runtime.evaluator import Evaluator

    runs: list[str] = []
    original = Evaluator.run

    def counting(self, params, outer=None, observer=None):
        runs.append(self.module.name)
        return original(self, params, outer, observer)

    monkeypatch.setattr(Evaluator, "run", counting)
    model = loop_model(accumulate_body(), inits={"M": np.array(4, np.int64), "c": np.array(True)})
    feeds = {k: np.ones(2, np.float32) for k in ("s0", "x", "w")}
    check(model, feeds, targets=("ref",))
    assert runs.count("main:loop0_body") == 4  # not 8: the second output reuses the first's run
