"""Malformed models are refused with an `OnnxParseError` naming the file and node (issue 16
case 5): non-SSA graphs, wrongly typed attributes, negative or overflowing dims, NUL bytes or
negative dims in external data, undecodable names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import pygraphx
from pygraphx.onnx.errors import OnnxParseError
from tests.helpers import make_model

X = np.zeros((2, 3), np.float32)


def _parse(model: onnx.ModelProto) -> pygraphx.Program:
    return pygraphx.parse_onnx_buffer(model.SerializeToString())


def test_two_nodes_writing_one_name() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Neg", ["x"], ["z"])],
        {"x": X},
        ["y"],
    )
    model.graph.node[1].output[0] = "y"
    model.graph.node[1].name = "b"
    with pytest.raises(OnnxParseError, match=r"node 'b' \(Neg\): output 'y' is already produced"):
        _parse(model)


def test_node_overwriting_a_graph_input() -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="r")], {"x": X}, ["y"])
    model.graph.node[0].output[0] = "x"
    with pytest.raises(OnnxParseError, match="output 'x' is already produced by a graph input"):
        _parse(model)


def test_graph_input_declared_twice() -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="r")], {"x": X}, ["y"])
    model.graph.input.append(model.graph.input[0])
    with pytest.raises(OnnxParseError, match="graph input 'x' is declared twice"):
        _parse(model)


def test_float_value_for_integer_attribute() -> None:
    model = make_model(
        [helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=1)], {"x": X}, ["y"]
    )
    attr = model.graph.node[0].attribute[0]
    attr.type, attr.f = onnx.AttributeProto.FLOAT, 1.0
    with pytest.raises(OnnxParseError, match="'sm'.*attribute 'axis' must be INT, got FLOAT"):
        _parse(model)


def test_integer_value_for_float_attribute_is_accepted() -> None:
    x = np.array([[-2.0, 3.0]], np.float32)
    model = make_model([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.5)], {"x": x}, ["y"])
    attr = model.graph.node[0].attribute[0]
    attr.type, attr.i = onnx.AttributeProto.INT, 2
    prog = _parse(model)
    prog.compile(pygraphx.get_target("ref"))
    np.testing.assert_array_equal(np.array(prog.run({"x": x})[0]), [[-4.0, 3.0]])


@pytest.mark.parametrize("dims", [[-4], [2, -1], [1 << 30, 1 << 30]])
def test_bad_initializer_dims(dims: list[int]) -> None:
    model = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        {"x": np.zeros(4, np.float32)},
        ["y"],
        {"w": np.zeros(4, np.float32)},
    )
    del model.graph.initializer[0].dims[:]
    model.graph.initializer[0].dims.extend(dims)
    with pytest.raises(OnnxParseError, match=r"initialiser 'w': (negative dimension|dims)"):
        _parse(model)


def _external_model(tmp_path: Path, location: str, dims: list[int]) -> Path:
    (tmp_path / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    w = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    w.ClearField("raw_data")
    del w.dims[:]
    w.dims.extend(dims)
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value=location)
    model = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])], {"x": np.zeros(4, np.float32)}, ["y"]
    )
    model.graph.initializer.append(w)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_external_data_negative_dims(tmp_path: Path) -> None:
    path = _external_model(tmp_path, "w.bin", [-1])
    with pytest.raises(OnnxParseError, match=f"{path}.*initialiser 'w': negative dimension"):
        pygraphx.parse_onnx(path)


def test_external_data_nul_in_location(tmp_path: Path) -> None:
    path = _external_model(tmp_path, "w.bin\x00.txt", [4])
    with pytest.raises(OnnxParseError, match="initialiser 'w'.*NUL byte"):
        pygraphx.parse_onnx(path)


def test_external_data_outside_model_dir(tmp_path: Path) -> None:
    path = _external_model(tmp_path, "../w.bin", [4])
    with pytest.raises(OnnxParseError, match="could leave the model's folder"):
        pygraphx.parse_onnx(path)


def test_good_external_data_still_loads(tmp_path: Path) -> None:
    path = _external_model(tmp_path, "w.bin", [4])
    prog = pygraphx.parse_onnx(path)
    prog.compile(pygraphx.get_target("ref"))
    out = prog.run({"x": np.ones(4, np.float32)})[0]
    np.testing.assert_array_equal(np.array(out), np.arange(4, dtype=np.float32) + 1)


def test_undecodable_op_type() -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": X}, ["y"])
    data = model.SerializeToString().replace(b"Relu", b"R\xefl\xff")
    with pytest.raises(OnnxParseError, match="not valid UTF-8"):
        pygraphx.parse_onnx_buffer(data)


def test_directory_and_device_are_refused(tmp_path: Path) -> None:
    with pytest.raises(OnnxParseError, match="is a directory"):
        pygraphx.parse_onnx(tmp_path)
    with pytest.raises(OnnxParseError, match="/dev/zero: not a regular file"):
        pygraphx.parse_onnx("/dev/zero")


def test_graph_attribute_of_the_wrong_type() -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": X}, ["y"])
    node = helper.make_node("If", ["c"], ["z"], name="branch")
    node.attribute.append(helper.make_attribute("then_branch", 3))
    node.attribute.append(helper.make_attribute("else_branch", 4))
    model.graph.node.append(node)
    model.graph.input.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    with pytest.raises(OnnxParseError, match="'branch'.*'then_branch' must be GRAPH, got INT"):
        _parse(model)
