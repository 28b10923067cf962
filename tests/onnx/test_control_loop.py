"""ONNX Loop as a program sub-module (its body), checked against ONNX Runtime: trip counts,
conditions, the length of scan outputs, carried sequences, growing values, and an If nested in
a body.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import pygraphx
from pygraphx.onnx.errors import OnnxParseError
from tests.helpers import make_model
from tests.onnx.control_flow_models import (
    F,
    accumulate_body,
    check,
    const,
    loop_body,
    loop_model,
    parse,
    vi,
)

# --- Loop -------------------------------------------------------------------------------------


def test_loop_with_constant_trip_count() -> None:
    model = loop_model(accumulate_body(), inits={"M": np.array(4, np.int64), "c": np.array(True)})
    rng = np.random.default_rng(1)
    feeds = {k: rng.standard_normal(2).astype(np.float32) for k in ("s0", "x", "w")}
    s, scans = check(model, feeds)
    assert scans.shape == (4, 2)
    assert "loop[max_iterations=4,output=1]" in str(parse(model))


def test_loop_trip_count_from_the_iteration_number_is_exact() -> None:
    # cond_out = i < 2: iterations 0, 1, 2 run (the condition is checked after each)
    body = loop_body(
        [
            const("two", np.array(2, np.int64)),
            helper.make_node("Less", ["i", "two"], ["keep"]),
            helper.make_node("Add", ["s_in", "x"], ["s_out"]),
            helper.make_node("Identity", ["s_out"], ["scan"]),
        ],
        cond_out="keep",
    )
    model = loop_model(body, inits={"M": np.array(10, np.int64), "c": np.array(True)})
    _, scans = check(
        model,
        {"s0": np.zeros(2, np.float32), "x": np.ones(2, np.float32), "w": np.ones(2, np.float32)},
    )
    assert scans.shape == (3, 2)


def test_loop_with_runtime_trip_count_uses_the_declared_length() -> None:
    model = loop_model(
        accumulate_body(),
        feeds={
            "M": np.array(3, np.int64),
            "c": np.array(True),
            "s0": np.zeros(2, np.float32),
            "x": np.ones(2, np.float32),
            "w": np.ones(2, np.float32),
        },
    )
    model.graph.output[1].type.tensor_type.shape.dim[0].dim_value = 3
    feeds = {
        "M": np.array(3, np.int64),
        "c": np.array(True),
        "s0": np.ones(2, np.float32),
        "x": np.full(2, 2, np.float32),
        "w": np.full(2, 0.5, np.float32),
    }
    check(model, feeds)
    prog = parse(model)
    prog.compile(pygraphx.get_target("ref"))
    # a shorter run leaves zero rows at the end (MIGraphX's behaviour); a longer one fails
    short = np.array(prog.run({**feeds, "M": np.array(2, np.int64)})[1])
    np.testing.assert_array_equal(short[2], 0)
    assert short[1].any()
    with pytest.raises(Exception, match="max_loop_iterations"):
        prog.run({**feeds, "M": np.array(4, np.int64)})


def test_loop_without_a_known_length_uses_max_loop_iterations() -> None:
    model = loop_model(
        accumulate_body(),
        feeds={
            "M": np.array(3, np.int64),
            "c": np.array(True),
            "s0": np.zeros(2, np.float32),
            "x": np.ones(2, np.float32),
            "w": np.ones(2, np.float32),
        },
    )
    prog = parse(model, max_loop_iterations=7)
    assert prog.get_output_shapes()[1].lens() == [7, 2]
    assert parse(model).get_output_shapes()[1].lens() == [10, 2]
    # without scan outputs the loop needs no static length and runs as long as it must
    body = loop_body([helper.make_node("Add", ["s_in", "x"], ["s_out"])], scans=())
    carried_only = loop_model(
        body,
        n_out=1,
        feeds={
            "M": np.array(3, np.int64),
            "c": np.array(True),
            "s0": np.zeros(2, np.float32),
            "x": np.ones(2, np.float32),
            "w": np.ones(2, np.float32),
        },
    )
    feeds = {
        "M": np.array(25, np.int64),
        "c": np.array(True),
        "s0": np.zeros(2, np.float32),
        "x": np.ones(2, np.float32),
        "w": np.ones(2, np.float32),
    }
    check(carried_only, feeds)


def test_loop_condition_stops_early() -> None:
    # stops when the running sum passes 5: a run-time condition
    body = loop_body(
        [
            helper.make_node("Add", ["s_in", "x"], ["s_out"]),
            helper.make_node("ReduceSum", ["s_out"], ["tot"], keepdims=0),
            const("five", np.array(5, np.float32)),
            helper.make_node("Less", ["tot", "five"], ["keep"]),
        ],
        scans=(),
        cond_out="keep",
    )
    model = loop_model(
        body,
        n_out=1,
        feeds={
            "M": np.array(3, np.int64),
            "c": np.array(True),
            "s0": np.zeros(2, np.float32),
            "x": np.ones(2, np.float32),
        },
    )
    feeds = {
        "M": np.array(100, np.int64),
        "c": np.array(True),
        "s0": np.zeros(2, np.float32),
        "x": np.array([0.5, 1.0], np.float32),
    }
    check(model, feeds)
    check(model, {**feeds, "c": np.array(False)})


def test_loop_slicing_at_the_iteration_number() -> None:
    # the slice's shape comes from the body at iteration 0 and is checked every iteration
    body = loop_body(
        [
            const("one", np.array([1], np.int64)),
            const("zero", np.array([0], np.int64)),
            helper.make_node("Unsqueeze", ["i", "zero"], ["start"]),
            helper.make_node("Add", ["start", "one"], ["end"]),
            helper.make_node("Slice", ["table", "start", "end"], ["row"]),
            helper.make_node("Squeeze", ["row", "zero"], ["r"]),
            helper.make_node("Add", ["s_in", "r"], ["s_out"]),
            helper.make_node("Identity", ["r"], ["scan"]),
        ]
    )
    table = np.arange(10, dtype=np.float32).reshape(5, 2)
    model = loop_model(
        body, inits={"M": np.array(5, np.int64), "c": np.array(True), "table": table}
    )
    check(
        model,
        {"s0": np.zeros(2, np.float32), "x": np.ones(2, np.float32), "w": np.ones(2, np.float32)},
    )


def test_loop_carrying_a_sequence_is_unrolled() -> None:
    body = loop_body(
        [
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Mul", ["x", "fi"], ["v"]),
            helper.make_node("SequenceInsert", ["seq_in", "v"], ["seq_out"]),
        ],
        carried=(("seq_in", "seq_out", F, None),),
        scans=(),
    )
    body.input[2].CopyFrom(
        helper.make_value_info(
            "seq_in", helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))
        )
    )
    body.output[1].CopyFrom(
        helper.make_value_info(
            "seq_out", helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))
        )
    )
    nodes = [
        helper.make_node("SequenceEmpty", [], ["s0"], dtype=F),
        helper.make_node("Loop", ["M", "c", "s0"], ["seq"], body=body),
        helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0, new_axis=1),
    ]
    model = make_model(
        nodes,
        {"x": np.ones(2, np.float32)},
        ["y"],
        {"M": np.array(3, np.int64), "c": np.array(True)},
    )
    check(model, {"x": np.array([1.0, -2.0], np.float32)})
    assert list(parse(model).modules) == ["main"]


def test_loop_with_a_growing_value_is_unrolled_or_refused() -> None:
    body = loop_body(
        [
            helper.make_node("Concat", ["s_in", "x"], ["s_out"], axis=0),
        ],
        carried=(("s_in", "s_out", F, None),),
        scans=(),
    )
    model = loop_model(body, n_out=1, inits={"M": np.array(3, np.int64), "c": np.array(True)})
    check(
        model,
        {"s0": np.zeros(2, np.float32), "x": np.ones(2, np.float32), "w": np.ones(2, np.float32)},
    )
    runtime = loop_model(
        body,
        n_out=1,
        feeds={
            "M": np.array(3, np.int64),
            "c": np.array(True),
            "s0": np.zeros(2, np.float32),
            "x": np.ones(2, np.float32),
        },
    )
    with pytest.raises(
        OnnxParseError,
        match=r"'loop1'.*loop-carried value 0 changes from "
        r"float_type \[2\] to float_type \[4\].*trip count M is a run-time",
    ):
        parse(runtime)


def test_if_nested_in_a_loop_body_reads_main_values() -> None:
    # body: s_out = if (i even) then s_in + x else s_in * w
    then_g = helper.make_graph([helper.make_node("Add", ["s_in", "x"], ["a"])], "t", [], [vi("a")])
    else_g = helper.make_graph([helper.make_node("Mul", ["s_in", "w"], ["b"])], "e", [], [vi("b")])
    body = loop_body(
        [
            const("two", np.array(2, np.int64)),
            helper.make_node("Mod", ["i", "two"], ["r"]),
            const("z", np.array(0, np.int64)),
            helper.make_node("Equal", ["r", "z"], ["even"]),
            helper.make_node("If", ["even"], ["s_out"], then_branch=then_g, else_branch=else_g),
            helper.make_node("Identity", ["s_out"], ["scan"]),
        ]
    )
    model = loop_model(body, inits={"M": np.array(5, np.int64), "c": np.array(True)})
    rng = np.random.default_rng(3)
    feeds = {k: rng.standard_normal(2).astype(np.float32) for k in ("s0", "x", "w")}
    check(model, feeds)
    prog = parse(model)
    assert "main:loop0_body:if0_then" in prog.modules
    assert prog.modules["main:loop0_body:if0_then"].parent is prog.modules["main:loop0_body"]
    prog.validate()
