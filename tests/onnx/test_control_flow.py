"""ONNX control flow (If, Loop, Scan) as program sub-modules, checked against ONNX Runtime.

Also: the printed form (sub-modules after main), save/load round trips, errors that name the
node and the sub-graph, dead-code elimination that keeps values only sub-modules read, and the
cpu target (which runs the optimisation passes over the bodies).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import pygraphx
from pygraphx.ir.program import Program
from pygraphx.onnx.errors import OnnxParseError, UnsupportedOperatorError
from pygraphx.ops import make_op
from pygraphx.ops.control import If
from pygraphx.passes.dead_code_elimination import dead_code_elimination
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


# --- If ---------------------------------------------------------------------------------------


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


# --- Loop -------------------------------------------------------------------------------------


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


# --- Scan -------------------------------------------------------------------------------------


def scan_body() -> onnx.GraphProto:
    return helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "xt"], ["s_out"]),
            helper.make_node("Mul", ["s_out", "w"], ["y"]),
        ],
        "scan_body",
        [vi("s_in", F, [3]), vi("xt", F, [3])],
        [vi("s_out", F, [3]), vi("y", F, [3])],
    )


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"scan_input_axes": [1], "scan_input_directions": [1]},
        {"scan_output_axes": [1], "scan_output_directions": [1]},
        {"scan_input_axes": [-1], "scan_output_axes": [-1], "scan_input_directions": [1]},
    ],
)
def test_scan9(attrs: dict) -> None:
    rng = np.random.default_rng(4)
    lens = (3, 4) if attrs.get("scan_input_axes", [0])[0] != 0 else (4, 3)
    feeds = {
        "s0": rng.standard_normal(3).astype(np.float32),
        "x": rng.standard_normal(lens).astype(np.float32),
        "w": rng.standard_normal(3).astype(np.float32),
    }
    node = helper.make_node(
        "Scan", ["s0", "x"], ["s", "ys"], num_scan_inputs=1, body=scan_body(), **attrs
    )
    check(make_model([node], feeds, ["s", "ys"], opset=16), feeds)


def test_scan8_with_a_batch_axis() -> None:
    rng = np.random.default_rng(5)
    feeds = {
        "s0": rng.standard_normal((2, 3)).astype(np.float32),
        "x": rng.standard_normal((2, 4, 3)).astype(np.float32),
        "w": rng.standard_normal(3).astype(np.float32),
    }
    node = helper.make_node(
        "Scan", ["", "s0", "x"], ["s", "ys"], num_scan_inputs=1, body=scan_body(), directions=[1]
    )
    check(make_model([node], feeds, ["s", "ys"], opset=8), feeds)


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
