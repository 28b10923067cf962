"""Seed 001's dynamic-shape flow: `map_input_dims` gives the maximum shape of an input the model
exports with a dynamic axis; smaller shapes then run, each compiled once. Checked against ONNX
Runtime on a ResNet-style export (torchvision's ResNet-18 layout, random weights)."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import pygraphx
from tests.helpers import run_ort

torch = pytest.importorskip("torch")
nn = torch.nn


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):  # noqa: ANN001, ANN201
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class _ResNet18Style(nn.Module):
    """ResNet-18's layout (stem, 4 stages of 2 basic blocks, pool, fc) at a quarter width."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )  # fmt: skip
        blocks, cin = [], width
        for k, stride in enumerate((1, 2, 2, 2)):
            cout = width * 2**k
            blocks += [_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):  # noqa: ANN001, ANN201
        y = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


@pytest.fixture(scope="module")
def resnet_dynamic_batch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = _ResNet18Style()
    with torch.no_grad():  # BatchNorm statistics away from the defaults: a spread of logits
        model.train()
        for _ in range(3):
            model(torch.randn(8, 3, 64, 64))
    buf = io.BytesIO()
    torch.onnx.export(
        model.eval(),
        (torch.randn(1, 3, 64, 64),),
        buf,
        input_names=["input"],
        output_names=["output"],
        opset_version=17,
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        dynamo=False,
    )
    path = tmp_path_factory.mktemp("resnet") / "resnet18_dyn.onnx"
    path.write_bytes(buf.getvalue())
    return path


def _image(shape: list[int]) -> np.ndarray:
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")


@pytest.mark.parametrize("target", ["ref", "cpu", pytest.param("gpu", marks=_GPU)])
def test_seed_001_max_shape_flow(resnet_dynamic_batch: Path, target: str) -> None:
    model = pygraphx.parse_onnx(resnet_dynamic_batch, map_input_dims={"input": [8, 3, 64, 64]})
    assert model.get_inputs()["input"] == pygraphx.Shape("float_type", [8, 3, 64, 64])
    assert str(model.get_parameter_shapes()["input"]).startswith("float_type, {{1, 8, {8}}, {3, 3}")
    model.compile(t=pygraphx.get_target(target), device_id=0)
    proto = onnx.load(str(resnet_dynamic_batch))
    for shape in ([1, 3, 64, 64], [2, 3, 64, 64], [8, 3, 64, 64], [2, 3, 64, 64]):
        x = _image(shape)
        (ours,) = model.run({"input": x})
        (expected,) = run_ort(proto, {"input": x})
        assert ours.get_shape().lens() == [shape[0], 10]
        np.testing.assert_allclose(np.array(ours), expected, rtol=1e-3, atol=1e-4)
    # each smaller shape compiled once (batch 2 came twice), the maximum runs the main program
    assert len(model._specialized) == 2
    with pytest.raises(pygraphx.ProgramError, match="expects lens within"):
        model.run({"input": _image([9, 3, 64, 64])})


def test_fixed_dims_stay_fixed(resnet_dynamic_batch: Path) -> None:
    model = pygraphx.parse_onnx(resnet_dynamic_batch, map_input_dims={"input": [4, 3, 64, 64]})
    model.compile(pygraphx.get_target("ref"))
    with pytest.raises(pygraphx.ProgramError, match="expects lens within"):
        model.run({"input": _image([2, 3, 32, 32])})
    static = pygraphx.parse_onnx(resnet_dynamic_batch, map_input_dims={"input": [1, 3, 64, 64]})
    assert not static.is_dynamic()


def test_compiled_max_shape_program_saves_and_loads(
    resnet_dynamic_batch: Path, tmp_path: Path
) -> None:
    model = pygraphx.parse_onnx(resnet_dynamic_batch, map_input_dims={"input": [4, 3, 64, 64]})
    model.compile(pygraphx.get_target("cpu"))
    pygraphx.save(model, tmp_path / "resnet.pgx")
    loaded = pygraphx.load(tmp_path / "resnet.pgx")
    assert loaded.target.name == "cpu" and loaded.is_dynamic()
    proto = onnx.load(str(resnet_dynamic_batch))
    for shape in ([3, 3, 64, 64], [4, 3, 64, 64]):
        x = _image(shape)
        (expected,) = run_ort(proto, {"input": x})
        np.testing.assert_allclose(
            np.array(loaded.run({"input": x})[0]), expected, rtol=1e-3, atol=1e-4
        )


def test_misspelt_keys_and_options_are_named(resnet_dynamic_batch: Path) -> None:
    with pytest.raises(
        pygraphx.OnnxParseError, match=r"map_input_dims names \['imput'\].*\['input'\]"
    ):
        pygraphx.parse_onnx(resnet_dynamic_batch, map_input_dims={"imput": [8, 3, 64, 64]})
    with pytest.raises(pygraphx.OnnxParseError, match="gives input 'input' 3 dimensions"):
        pygraphx.parse_onnx(resnet_dynamic_batch, map_input_dims={"input": [8, 3, 64]})
    with pytest.raises(
        TypeError, match="map_input_dim'].*default_dyn_dim_value.*map_dyn_input_dims"
    ):
        pygraphx.parse_onnx(resnet_dynamic_batch, map_input_dim={"input": [8, 3, 64, 64]})


def _value_shaped_model() -> onnx.ModelProto:
    """ReduceSum whose `axes` is a graph input: the output shape depends on its value."""
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
            helper.make_tensor_value_info("axes", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    # IR version 10: the ONNX Runtime oracle may be older than the onnx package (1.30 reads <= 13)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_value_dependent_shapes_run_through_the_plain_api() -> None:
    model = _value_shaped_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("ref"))
    x = _image([2, 3, 4])
    for axis in (0, 2, 1, 2):
        feeds = {"x": x, "axes": np.array([axis], np.int64)}
        (expected,) = run_ort(model, feeds)
        np.testing.assert_allclose(np.array(prog.run(feeds)[0]), expected, rtol=1e-6)
    assert len(prog._specialized) == 3
    with pytest.raises(pygraphx.OnnxParseError, match="depends on a runtime value"):
        pygraphx.parse_onnx_buffer(model.SerializeToString(), specialize_on_input_values=False)


def test_value_cache_is_bounded_and_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import pygraphx.ir.program as program_module

    monkeypatch.setattr(program_module, "SPECIALIZED_CACHE_SIZE", 2)
    model = _value_shaped_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("ref"))
    x = _image([2, 3, 4])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for axis in (0, 1, 2, 0, 1, -1):
            feeds = {"x": x, "axes": np.array([axis], np.int64)}
            (expected,) = run_ort(model, feeds)
            np.testing.assert_allclose(np.array(prog.run(feeds)[0]), expected, rtol=1e-6)
    changing = [w for w in caught if "keep changing" in str(w.message)]
    assert len(changing) == 1 and "axes" in str(changing[0].message)
    assert len(prog._specialized) == 2
