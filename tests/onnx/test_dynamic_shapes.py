"""Dynamic input dimensions: map_dyn_input_dims / default_dyn_dim_value, run at many shapes."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

import pygraphx
from pygraphx.ir.shape import DynamicDimension
from tests.helpers import run_ort

torch = pytest.importorskip("torch")


class _SmallCnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):  # noqa: ANN001, ANN201
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.flatten(torch.nn.functional.adaptive_avg_pool2d(y, 1), 1)
        return torch.softmax(self.fc(y), dim=-1)


@pytest.fixture(scope="module")
def dynamic_batch_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = _SmallCnn().eval()
    buf = io.BytesIO()
    torch.onnx.export(
        model,
        (torch.randn(1, 3, 16, 16),),
        buf,
        input_names=["input"],
        output_names=["output"],
        opset_version=17,
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        dynamo=False,
    )
    path = tmp_path_factory.mktemp("dyn") / "cnn.onnx"
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize("optimize", [False, True])
def test_dynamic_batch_runs_at_1_3_8(dynamic_batch_model: Path, optimize: bool) -> None:
    import onnx

    model = onnx.load(str(dynamic_batch_model))
    prog = pygraphx.parse_onnx(
        dynamic_batch_model, map_dyn_input_dims={"input": [(1, 8), 3, 16, 16]}
    )
    shape = prog.get_parameter_shapes()["input"]
    assert shape.dynamic() and shape.max_lens() == [8, 3, 16, 16]
    assert "@param:input -> float_type, {{1, 8}, {3, 3}, {16, 16}, {16, 16}}" in str(prog)
    if optimize:
        pygraphx.optimize(prog)
    prog.compile(pygraphx.get_target("ref"))
    rng = np.random.default_rng(0)
    for batch in (1, 3, 8):
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        ours = np.array(prog.run({"input": x})[0])
        (expected,) = run_ort(model, {"input": x})
        assert ours.shape == (batch, 5)
        np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(pygraphx.ProgramError, match="expects lens within"):
        prog.run({"input": np.zeros((9, 3, 16, 16), np.float32)})


def test_default_dyn_dim_value(dynamic_batch_model: Path) -> None:
    prog = pygraphx.parse_onnx(
        dynamic_batch_model, default_dyn_dim_value=DynamicDimension(1, 4, (2,))
    )
    assert str(prog.get_parameter_shapes()["input"]).startswith("float_type, {{1, 4, {2}}")
    prog.compile(pygraphx.get_target("ref"))
    out = prog.run({"input": np.ones((2, 3, 16, 16), np.float32)})
    assert out[0].get_shape().lens() == [2, 5]


def test_compiled_dynamic_program_saves_and_loads(
    dynamic_batch_model: Path, tmp_path: Path
) -> None:
    import onnx

    prog = pygraphx.parse_onnx(
        dynamic_batch_model, map_dyn_input_dims={"input": [(1, 8), 3, 16, 16]}
    )
    prog.compile(pygraphx.get_target("ref"))
    pygraphx.save(prog, tmp_path / "x.pgx")
    loaded = pygraphx.load(tmp_path / "x.pgx")
    assert loaded.get_parameter_shapes() == prog.get_parameter_shapes()
    model = onnx.load(str(dynamic_batch_model))
    for batch in (2, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        (expected,) = run_ort(model, {"input": x})
        np.testing.assert_allclose(
            np.array(loaded.run({"input": x})[0]), expected, rtol=1e-4, atol=1e-5
        )


def test_dynamic_programs_with_transforms_refuse_to_be_saved(
    dynamic_batch_model: Path, tmp_path: Path
) -> None:
    prog = pygraphx.parse_onnx(
        dynamic_batch_model, map_dyn_input_dims={"input": [(1, 8), 3, 16, 16]}
    )
    pygraphx.optimize(prog)
    with pytest.raises(pygraphx.SerializationError, match="transforms"):
        pygraphx.save(prog, tmp_path / "x.pgx")


def test_bad_dynamic_options(dynamic_batch_model: Path) -> None:
    expected = r"names \['nope'\], which the model has no input for; its inputs are \['input'\]"
    with pytest.raises(pygraphx.OnnxParseError, match=expected):
        pygraphx.parse_onnx(dynamic_batch_model, map_dyn_input_dims={"nope": [(1, 2)]})
    with pytest.raises(pygraphx.OnnxParseError, match="bad dynamic dimension"):
        pygraphx.parse_onnx(dynamic_batch_model, map_dyn_input_dims={"input": [(4, 2), 3, 16, 16]})
