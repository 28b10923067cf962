"""The frontend's errors: unsupported ops, corrupt files, unsafe external data, bad inputs.

Each failure must be one clear `OnnxParseError` that names the problem.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import pygraphx
from pygraphx.onnx.errors import ExternalDataError, OnnxParseError, UnsupportedOperatorError


def _model(nodes, opsets=(("", 17),), inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 8
    return model


def test_every_unsupported_op_is_listed_once() -> None:
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="ok"),
            helper.make_node("FooBar", ["a"], ["b"], name="foo1"),
            helper.make_node("FooBar", ["b"], ["c"], name="foo2"),
            helper.make_node("Frob", ["c"], ["d"], name="frob", domain="com.example"),
        ],
        opsets=(("", 17), ("com.example", 3)),
    )
    with pytest.raises(UnsupportedOperatorError) as info:
        pygraphx.parse_onnx_buffer(model.SerializeToString())
    msg = str(info.value)
    assert "2 unsupported operator(s)" in msg
    assert "ai.onnx::FooBar (opset 17): foo1, foo2" in msg
    assert "com.example::Frob (opset 3): frob" in msg
    assert {(d, o) for d, o, _, _ in info.value.unsupported} == {
        ("ai.onnx", "FooBar"),
        ("com.example", "Frob"),
    }


def test_skip_unknown_operators_parses_and_fails_only_when_run() -> None:
    model = _model([helper.make_node("FooBar", ["x"], ["y"], name="foo")])
    model = onnx.shape_inference.infer_shapes(model)
    model.graph.output[0].type.tensor_type.shape.Clear()
    for d in (2, 3):
        model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = d
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString(), skip_unknown_operators=True)
    assert "unknown:FooBar" in str(prog)
    prog.compile(pygraphx.get_target("ref"))
    with pytest.raises(RuntimeError, match="FooBar"):
        prog.run({"x": np.zeros((2, 3), np.float32)})


@pytest.mark.parametrize("cut", [0.0, 0.3, 0.9])
def test_truncated_or_corrupt_file(tmp_path: Path, cut: float) -> None:
    weights = numpy_helper.from_array(np.ones((3,), np.float32), "w")
    data = _model([helper.make_node("Add", ["x", "w"], ["y"])], inits=[weights])
    raw = data.SerializeToString()
    path = tmp_path / "bad.onnx"
    path.write_bytes(raw[: int(len(raw) * cut)])
    with pytest.raises(OnnxParseError) as info:
        pygraphx.parse_onnx(path)
    assert str(path) in str(info.value)
    assert "not a valid ONNX model" in str(info.value) or "empty" in str(info.value)


def test_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "noise.onnx"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(OnnxParseError, match="not a valid ONNX model"):
        pygraphx.parse_onnx(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OnnxParseError, match="no such file"):
        pygraphx.parse_onnx(tmp_path / "missing.onnx")


def _external_model(tmp_path: Path, location: str, length: int | None = None) -> Path:
    tensor = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": "0"}
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        e = tensor.external_data.add()
        e.key, e.value = k, v
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], inits=[tensor])
    path = tmp_path / "model" / "m.onnx"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def test_external_data_loads_inside_folder(tmp_path: Path) -> None:
    path = _external_model(tmp_path, "weights.bin", 24)
    (path.parent / "weights.bin").write_bytes(np.arange(6, dtype=np.float32).tobytes())
    prog = pygraphx.parse_onnx(path)
    prog.compile(pygraphx.get_target("ref"))
    out = np.array(prog.run({"x": np.ones((2, 3), np.float32)})[0])
    np.testing.assert_array_equal(out, np.arange(6, dtype=np.float32).reshape(2, 3) + 1)


@pytest.mark.parametrize(
    ("location", "needle"),
    [("../secret.bin", "contains '..'"), ("/etc/passwd", "absolute"), ("sub/../../x", "'..'")],
)
def test_external_data_escaping_the_folder_is_refused(
    tmp_path: Path, location: str, needle: str
) -> None:
    path = _external_model(tmp_path, location)
    (tmp_path / "secret.bin").write_bytes(b"\0" * 24)
    with pytest.raises(ExternalDataError, match=needle):
        pygraphx.parse_onnx(path)


def test_external_data_symlink_out_of_folder_is_refused(tmp_path: Path) -> None:
    path = _external_model(tmp_path, "link.bin")
    (tmp_path / "secret.bin").write_bytes(b"\0" * 24)
    os.symlink(tmp_path / "secret.bin", path.parent / "link.bin")
    with pytest.raises(ExternalDataError, match="outside the model's folder"):
        pygraphx.parse_onnx(path)


def test_external_data_too_short_or_wrong_length(tmp_path: Path) -> None:
    path = _external_model(tmp_path, "weights.bin")
    (path.parent / "weights.bin").write_bytes(b"\0" * 10)
    with pytest.raises(ExternalDataError, match="only 10 bytes"):
        pygraphx.parse_onnx(path)
    path = _external_model(tmp_path, "weights.bin", length=8)
    with pytest.raises(ExternalDataError, match="does not match"):
        pygraphx.parse_onnx(path)


def test_external_data_from_buffer_is_refused(tmp_path: Path) -> None:
    path = _external_model(tmp_path, "weights.bin", 24)
    with pytest.raises(ExternalDataError, match="buffer"):
        pygraphx.parse_onnx_buffer(path.read_bytes())


def test_handler_error_names_node_op_and_opset() -> None:
    model = _model(
        [helper.make_node("Add", ["x", "w"], ["y"], name="bad_add")],
        inits=[numpy_helper.from_array(np.ones((4,), np.float32), "w")],
    )
    with pytest.raises(OnnxParseError) as info:
        pygraphx.parse_onnx_buffer(model.SerializeToString())
    msg = str(info.value)
    assert "node 'bad_add' (ai.onnx::Add, opset 17)" in msg
    assert "broadcast" in msg


def test_undefined_input_is_reported() -> None:
    model = _model([helper.make_node("Relu", ["nope"], ["y"], name="r")])
    with pytest.raises(OnnxParseError, match="'nope' is not produced"):
        pygraphx.parse_onnx_buffer(model.SerializeToString())


def test_wrong_run_inputs_are_reported() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])])
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    with pytest.raises(pygraphx.ProgramError, match="compile the program first"):
        prog.run({"x": np.zeros((2, 3), np.float32)})
    prog.compile(pygraphx.get_target("ref"))
    with pytest.raises(pygraphx.ProgramError, match="expects float_type but got double_type"):
        prog.run({"x": np.zeros((2, 3))})
    with pytest.raises(pygraphx.ProgramError, match=r"expects lens \[2, 3\]"):
        prog.run({"x": np.zeros((3, 3), np.float32)})
    with pytest.raises(pygraphx.ProgramError, match="missing parameter 'x'"):
        prog.run({})
    with pytest.raises(pygraphx.ProgramError, match="unknown parameter"):
        prog.run({"x": np.zeros((2, 3), np.float32), "z": 1})


def test_unknown_parse_option() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])])
    with pytest.raises(TypeError, match="unknown parse option"):
        pygraphx.parse_onnx_buffer(model.SerializeToString(), default_dim=3)
