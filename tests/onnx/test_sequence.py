"""ONNX sequences and optionals, resolved at parse time into tensor instructions (vs ORT).

A sequence built from static pieces (split, construct, insert/erase at constant positions,
SequenceMap over it) is a compile-time list of instructions; only what a tensor program can
take and return crosses the graph boundary. The refusals say why.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import pygraphx
from pygraphx.onnx.errors import OnnxParseError
from tests.helpers import assert_outputs_match, make_model, run_ort, run_pgx

F = TensorProto.FLOAT


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    ref = run_ort(model, feeds)
    ours = run_pgx(model, feeds)
    assert_outputs_match(ours, ref, rtol=1e-6, atol=1e-6)
    return ours


def parse(model: onnx.ModelProto) -> pygraphx.Program:
    return pygraphx.parse_onnx_buffer(model.SerializeToString())


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


@pytest.mark.parametrize("axis,new_axis", [(0, 0), (1, 0), (-1, 0), (0, 1), (2, 1), (-1, 1)])
def test_split_to_sequence_then_concat(axis: int, new_axis: int) -> None:
    nodes = [
        helper.make_node("SplitToSequence", ["x", "s"], ["seq"], axis=1),
        helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=axis, new_axis=new_axis),
    ]
    sizes = [1, 2] if (axis, new_axis) == (1, 0) else [1, 1, 1]  # pieces concat must fit
    model = make_model(nodes, {"x": X}, ["y"], {"s": np.array(sizes, np.int64)})
    check(model, {"x": X})


@pytest.mark.parametrize(
    "split,keepdims", [(None, 1), (None, 0), (np.array(3), 1), (np.array([1, 3]), 1)]
)
def test_split_to_sequence_forms(split, keepdims: int) -> None:
    inits = {} if split is None else {"s": split.astype(np.int64)}
    nodes = [
        helper.make_node(
            "SplitToSequence", ["x"] + (["s"] if inits else []), ["seq"], axis=2, keepdims=keepdims
        ),
        helper.make_node("SequenceLength", ["seq"], ["n"]),
        helper.make_node("SequenceAt", ["seq", "last"], ["y"]),
    ]
    inits["last"] = np.array(-1, np.int64)
    model = make_model(nodes, {"x": X}, ["n", "y"], inits)
    check(model, {"x": X})


def test_construct_insert_erase_at() -> None:
    a, b, c = (np.full((2, 2), v, np.float32) for v in (1, 2, 3))
    nodes = [
        helper.make_node("SequenceConstruct", ["a", "b"], ["s0"]),
        helper.make_node("SequenceInsert", ["s0", "c", "zero"], ["s1"]),  # c, a, b
        helper.make_node("SequenceInsert", ["s1", "a"], ["s2"]),  # c, a, b, a
        helper.make_node("SequenceErase", ["s2", "one"], ["s3"]),  # c, b, a
        helper.make_node("SequenceErase", ["s3"], ["s4"]),  # c, b
        helper.make_node("SequenceLength", ["s3"], ["n"]),
        helper.make_node("SequenceAt", ["s4", "one"], ["y1"]),
        helper.make_node("ConcatFromSequence", ["s3"], ["y"], axis=0),
    ]
    inits = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64)}
    model = make_model(nodes, {"a": a, "b": b, "c": c}, ["y", "n", "y1"], inits, opset=13)
    check(model, {"a": a, "b": b, "c": c})


def test_sequence_empty_then_insert() -> None:
    nodes = [
        helper.make_node("SequenceEmpty", [], ["e"], dtype=F),
        helper.make_node("SequenceInsert", ["e", "x"], ["s1"]),
        helper.make_node("SequenceInsert", ["s1", "x"], ["s2"]),
        helper.make_node("ConcatFromSequence", ["s2"], ["y"], axis=0, new_axis=1),
    ]
    model = make_model(nodes, {"x": X[0]}, ["y"])
    check(model, {"x": X[0]})


@pytest.mark.parametrize("pos", [0, 2, -1, -3])
def test_sequence_at_a_runtime_position(pos: int) -> None:
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0, keepdims=0),
        helper.make_node("SequenceAt", ["seq", "p"], ["y"]),
    ]
    feeds = {"x": X[0], "p": np.array(pos, np.int64)}
    model = make_model(nodes, feeds, ["y"])
    check(model, feeds)
    assert "sequence_at" in str(parse(model))


def test_sequence_at_a_runtime_position_out_of_range_fails_at_run_time() -> None:
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0, keepdims=0),
        helper.make_node("SequenceAt", ["seq", "p"], ["y"]),
    ]
    feeds = {"x": X[0], "p": np.array(3, np.int64)}
    prog = parse(make_model(nodes, feeds, ["y"]))
    prog.compile(pygraphx.get_target("ref"))
    with pytest.raises(Exception, match="position 3 is out of range for 3 elements"):
        prog.run(feeds)


def test_sequence_map_is_unrolled() -> None:
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["e", "w"], ["m"]),
            helper.make_node("ReduceSum", ["m"], ["r"], keepdims=0),
        ],
        "map_body",
        [helper.make_tensor_value_info("e", F, None), helper.make_tensor_value_info("w", F, None)],
        [helper.make_tensor_value_info("r", F, None)],
    )
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0, keepdims=0),
        helper.make_node("SequenceMap", ["seq", "w"], ["out"], body=body),
        helper.make_node("ConcatFromSequence", ["out"], ["y"], axis=0, new_axis=1),
    ]
    feeds = {"x": X[0], "w": np.linspace(-1, 1, 4).astype(np.float32)}
    model = make_model(nodes, feeds, ["y"])
    check(model, feeds)
    assert list(parse(model).modules) == ["main"]


def test_if_with_sequence_outputs_of_the_same_structure() -> None:
    def branch(op: str) -> onnx.GraphProto:
        return helper.make_graph(
            [
                helper.make_node(op, ["x"], ["t"]),
                helper.make_node("SequenceConstruct", ["t", "x"], ["s"]),
            ],
            f"{op}_branch",
            [],
            [
                helper.make_value_info(
                    "s", helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))
                )
            ],
        )

    nodes = [
        helper.make_node(
            "If", ["c"], ["seq"], then_branch=branch("Neg"), else_branch=branch("Abs")
        ),
        helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0),
    ]
    feeds = {"c": np.array(True), "x": X[0] - 5}
    model = make_model(nodes, feeds, ["y"])
    for c in (True, False):
        check(model, {**feeds, "c": np.array(c)})
    assert "main:if0_then" in parse(model).modules


def test_optional_tensor() -> None:
    nodes = [
        helper.make_node("Optional", ["x"], ["o"]),
        helper.make_node("OptionalHasElement", ["o"], ["has"]),
        helper.make_node("OptionalGetElement", ["o"], ["v"]),
        helper.make_node("Optional", [], ["none"], type=helper.make_tensor_type_proto(F, None)),
        helper.make_node("OptionalHasElement", ["none"], ["has_none"]),
        helper.make_node("Relu", ["v"], ["y"]),
    ]
    feeds = {"x": X[0] - 5}
    model = make_model(nodes, feeds, ["has", "has_none", "y"], opset=18)
    check(model, feeds)


def test_identity_passes_a_sequence_through() -> None:
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0),
        helper.make_node("Identity", ["seq"], ["seq2"]),
        helper.make_node("ConcatFromSequence", ["seq2"], ["y"], axis=1),
    ]
    check(make_model(nodes, {"x": X[0]}, ["y"]), {"x": X[0]})


# --- refusals ---------------------------------------------------------------------------------


def _seq_graph(nodes, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


SEQ = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [2]))


def test_sequence_graph_input_is_built_per_value() -> None:
    model = _seq_graph(
        [helper.make_node("SequenceAt", ["s", "p"], ["y"])],
        [helper.make_value_info("s", SEQ), helper.make_tensor_value_info("p", 7, [])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    prog = parse(model)
    prog.compile(pygraphx.get_target("ref"))
    seq = [np.full((2, 3), k, np.float32) for k in (1, 2, 3)]
    for p in (2, 0, -2):  # oracle: Python indexing, which SequenceAt follows
        out = prog.run({"s": seq, "p": np.array(p, np.int64)})
        np.testing.assert_array_equal(np.array(out[0]), seq[p])
    with pytest.raises(pygraphx.ProgramError, match=r"missing input\(s\) \['s'\]"):
        prog.run({"p": np.array(0, np.int64)})
    with pytest.raises(OnnxParseError, match="input 's' is a sequence or an optional"):
        pygraphx.parse_onnx_buffer(model.SerializeToString(), specialize_on_input_values=False)


def test_sequence_graph_output_is_a_list() -> None:
    model = _seq_graph(
        [helper.make_node("SplitToSequence", ["x"], ["s"])],
        [helper.make_tensor_value_info("x", F, [2, 2])],
        [helper.make_value_info("s", SEQ)],
    )
    prog = parse(model)
    prog.compile(pygraphx.get_target("ref"))
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    (seq,) = prog.run({"x": x})
    assert isinstance(seq, list) and len(seq) == 2  # oracle: numpy's split along axis 0
    for got, want in zip(seq, np.split(x, 2, axis=0), strict=True):
        np.testing.assert_array_equal(np.array(got), want)


def test_sequence_given_to_a_tensor_operator_is_refused() -> None:
    model = _seq_graph(
        [
            helper.make_node("SplitToSequence", ["x"], ["s"]),
            helper.make_node("Relu", ["s"], ["y"], name="relu1"),
        ],
        [helper.make_tensor_value_info("x", F, [2, 2])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    with pytest.raises(
        OnnxParseError,
        match=r"'relu1'.*input 0 \('s'\) is a sequence of 2 "
        r"float_type tensor\(s\); this operator takes tensors",
    ):
        parse(model)


def test_runtime_insert_position_is_refused() -> None:
    model = _seq_graph(
        [
            helper.make_node("SplitToSequence", ["x"], ["s"]),
            helper.make_node("SequenceInsert", ["s", "x", "p"], ["s2"], name="ins"),
            helper.make_node("ConcatFromSequence", ["s2"], ["y"], axis=0),
        ],
        [helper.make_tensor_value_info("x", F, [2, 2]), helper.make_tensor_value_info("p", 7, [])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    with pytest.raises(OnnxParseError, match="'ins'.*'position' must be known at compile time"):
        pygraphx.parse_onnx_buffer(model.SerializeToString(), specialize_on_input_values=False)


def test_runtime_position_over_elements_of_different_shapes_is_refused() -> None:
    model = _seq_graph(
        [
            helper.make_node("SplitToSequence", ["x", "sizes"], ["s"]),
            helper.make_node("SequenceAt", ["s", "p"], ["y"], name="at"),
        ],
        [helper.make_tensor_value_info("x", F, [3, 2]), helper.make_tensor_value_info("p", 7, [])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 2]), "sizes"))
    with pytest.raises(OnnxParseError, match="'at'.*elements have different shapes"):
        parse(model)


def test_empty_optional_get_element_is_refused() -> None:
    model = _seq_graph(
        [
            helper.make_node("Optional", [], ["o"], type=helper.make_tensor_type_proto(F, None)),
            helper.make_node("OptionalGetElement", ["o"], ["y"], name="get"),
        ],
        [],
        [helper.make_tensor_value_info("y", F, None)],
    )
    with pytest.raises(OnnxParseError, match="'get'.*the optional is empty"):
        parse(model)
