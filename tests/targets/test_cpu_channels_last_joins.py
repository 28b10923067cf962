"""Concat and resize between convolutions on the `cpu` target keep the convolutions' channels-last
layout (`lower_layout.concat_layout`, `lower_resize`): a UNet decoder's upsample + skip concat
would otherwise transpose every tensor into the standard layout and back. Checked against ONNX
Runtime on graphs whose joins see channels-last parts, standard parts (a graph input) and a mix,
for every resize path the lowering takes (F.interpolate, and the separable gathers for modes it
does not take) and for a ConvTranspose upsampling."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, STANDARD  # noqa: E402

RNG = np.random.default_rng(7)


def _conv(name: str, x: str, c_in: int, c_out: int, inits: list) -> onnx.NodeProto:
    w = (RNG.standard_normal((c_out, c_in, 3, 3)) * 0.2).astype(np.float32)
    b = RNG.standard_normal(c_out).astype(np.float32)
    inits += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
    return helper.make_node(
        "Conv", [x, f"{name}_w", f"{name}_b"], [name], pads=[1, 1, 1, 1], name=name
    )


def _model(resize_attrs: dict, skip_from_input: bool) -> onnx.ModelProto:
    """x -> conv a -> relu -> maxpool -> conv b -> resize x2 -> concat(skip, up) -> conv c."""
    inits: list = []
    nodes = [
        _conv("a", "x", 3, 8, inits),
        helper.make_node("Relu", ["a"], ["ar"]),
        helper.make_node("MaxPool", ["ar"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        _conv("b", "p", 8, 8, inits),
        helper.make_node("Relu", ["b"], ["br"]),
    ]
    if resize_attrs.get("mode") == "transpose":  # a ConvTranspose 2x2/2 upsamples instead
        w = (RNG.standard_normal((8, 8, 2, 2)) * 0.2).astype(np.float32)
        inits.append(numpy_helper.from_array(w, "wt"))
        nodes.append(helper.make_node("ConvTranspose", ["br", "wt"], ["up"], strides=[2, 2]))
    else:
        inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
        nodes.append(helper.make_node("Resize", ["br", "", "scales"], ["up"], **resize_attrs))
    skip, c_skip = ("x", 3) if skip_from_input else ("ar", 8)
    nodes += [
        helper.make_node("Concat", [skip, "up"], ["cat"], axis=1),
        _conv("c", "cat", c_skip + 8, 4, inits),
    ]
    graph = helper.make_graph(
        nodes,
        "joins",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 4, 16, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


RESIZES = {
    "linear_half_pixel": {"mode": "linear", "coordinate_transformation_mode": "half_pixel"},
    "nearest_asymmetric": {
        "mode": "nearest",
        "coordinate_transformation_mode": "asymmetric",
        "nearest_mode": "floor",
    },
    # not an F.interpolate case (round_prefer_ceil): the separable gathers
    "nearest_gathers": {
        "mode": "nearest",
        "coordinate_transformation_mode": "half_pixel",
        "nearest_mode": "round_prefer_ceil",
    },
    "cubic_gathers": {
        "mode": "cubic",
        "coordinate_transformation_mode": "half_pixel",
        "cubic_coeff_a": -0.5,
    },
    "conv_transpose": {"mode": "transpose"},
}


@pytest.mark.parametrize("skip_from_input", [False, True], ids=["skip_conv", "skip_input"])
@pytest.mark.parametrize("resize", sorted(RESIZES))
def test_joins_between_convolutions_match_onnxruntime(resize: str, skip_from_input: bool) -> None:
    model = _model(RESIZES[resize], skip_from_input)
    x = RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu"))
    assert not prog._executable.fallbacks, "no op may fall back to numpy here"
    got = np.asarray(prog.run({"x": x})[0])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_resize_and_concat_of_convolutions_stay_channels_last() -> None:
    """The layouts the lowering records: the resize of a convolution's output and the concat of
    two convolutions' outputs are channels-last; a concat with a graph input is standard."""
    for skip_from_input, want_cat in ((False, CHANNELS_LAST), (True, STANDARD)):
        model = _model(RESIZES["linear_half_pixel"], skip_from_input)
        assert _layouts(model, ("resize", "concat")) == {
            "resize": CHANNELS_LAST,
            "concat": want_cat,
        }


def test_conv_transpose_output_joins_channels_last() -> None:
    """A ConvTranspose of a convolution's output is recorded channels-last (torch keeps the
    layout), so its concat with a convolution's skip stays channels-last too."""
    model = _model(RESIZES["conv_transpose"], skip_from_input=False)
    assert _layouts(model, ("deconvolution", "concat")) == {
        "deconvolution": CHANNELS_LAST,
        "concat": CHANNELS_LAST,
    }


def _layouts(model: onnx.ModelProto, ops: tuple[str, ...]) -> dict[str, str]:
    """The layout the cpu lowering recorded for the instruction of each op in `ops`."""
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu"))
    ctx = prog._executable.lowered.ctx
    return {
        ins.op.name: ctx.layout[ctx.index[id(ins)]]
        for ins in prog.get_main_module().instructions
        if ins.op.name in ops
    }
