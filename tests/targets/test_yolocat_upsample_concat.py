"""A nearest upsample feeding a concat (YOLOv8's neck: `nn.Upsample(2)` of a C2f output joined
with a backbone level) on the `cpu` target: `lower_resize` defers the resize into the concat and
one step repeats the upsample's input straight into its window of the concat's output
(`concat_with_repeat`); every other resize writes its slot with torch's out= kernels
(`resize_writer`). Checked against ONNX Runtime, channels-last (between convolutions) and
standard (graph inputs), on either side of the concat, twice in one concat, along a spatial
axis, with a second user (not deferred), and in the profiled (unfused) run."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from tests.helpers import make_model  # noqa: E402
from tests.targets.cpu_compare import assert_profile_matches  # noqa: E402

RNG = np.random.default_rng(11)
NEAREST = {
    "mode": "nearest",
    "coordinate_transformation_mode": "asymmetric",
    "nearest_mode": "floor",
}


def _conv(name: str, x: str, c_in: int, c_out: int, inits: dict, stride: int = 1) -> list:
    inits[f"{name}_w"] = (RNG.standard_normal((c_out, c_in, 3, 3)) * 0.2).astype(np.float32)
    conv = helper.make_node(
        "Conv", [x, f"{name}_w"], [f"{name}_c"], pads=[1, 1, 1, 1], strides=[stride, stride]
    )
    return [conv, helper.make_node("Relu", [f"{name}_c"], [name])]


def _model(order: str, axis: int = 1, from_convs: bool = True, extra_user: bool = False) -> tuple:
    """x [1,4,16,16] -> (conv a) -> (conv b, stride 2) -> Resize x2 -> Concat per `order`
    ("us": up then skip, "su", "usu": up twice) -> y (+ the upsample itself with `extra_user`)."""
    inits: dict = {"scales": np.array([1, 1, 2, 2], np.float32)}
    nodes: list = []
    skip, low = "x", "x_low"
    feeds = {"x": RNG.standard_normal((1, 4, 16, 16)).astype(np.float32)}
    if from_convs:
        nodes += _conv("a", "x", 4, 6, inits) + _conv("b", "a", 6, 6, inits, stride=2)
        skip, low = "a", "b"
    else:
        feeds["x_low"] = RNG.standard_normal((1, 4, 8, 8)).astype(np.float32)
    nodes.append(helper.make_node("Resize", [low, "", "scales"], ["up"], **NEAREST))
    parts = ["up" if c == "u" else skip for c in order]
    nodes.append(helper.make_node("Concat", parts, ["y"], axis=axis))
    outputs = ["y"]
    if extra_user:
        nodes.append(helper.make_node("Sigmoid", ["up"], ["z"]))
        outputs.append("z")
    return make_model(nodes, feeds, outputs, inits), feeds


def _compile_and_check(model: onnx.ModelProto, feeds: dict) -> pygraphx.Program:
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu"))
    assert not prog._executable.fallbacks, "no op may fall back to numpy here"
    for _ in range(2):  # the second run reuses every slot
        got = prog.run(dict(feeds))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)
    return prog


def _fused_steps(prog: pygraphx.Program) -> list[list[str]]:
    steps = prog._executable.lowered.ctx.steps
    return [[i.op.name for i in s.instructions] for s in steps if len(s.instructions) > 1]


@pytest.mark.parametrize("from_convs", [True, False], ids=["channels_last", "standard"])
@pytest.mark.parametrize("order", ["us", "su", "usu"])
def test_upsample_writes_its_concat_window(order: str, from_convs: bool) -> None:
    model, feeds = _model(order, from_convs=from_convs)
    prog = _compile_and_check(model, feeds)
    assert ["resize", "concat"] in _fused_steps(prog)
    assert_profile_matches(prog, feeds)


def test_upsample_into_a_spatial_concat() -> None:
    """The window is along the height axis: the repeat still splits the window's own axes."""
    model, feeds = _model("us", axis=2)
    prog = _compile_and_check(model, feeds)
    assert ["resize", "concat"] in _fused_steps(prog)


def test_upsample_with_a_second_user_writes_its_own_slot() -> None:
    model, feeds = _model("us", extra_user=True)
    prog = _compile_and_check(model, feeds)
    assert ["resize", "concat"] not in _fused_steps(prog)


@pytest.mark.parametrize(
    ("mode", "rank", "ctm"),
    [
        ("linear", 3, "half_pixel"),
        ("linear", 4, "align_corners"),
        ("linear", 5, "pytorch_half_pixel"),
        ("cubic", 4, "half_pixel"),
        ("nearest", 5, "asymmetric"),
    ],
)
def test_resize_out_kernels_match_onnxruntime(mode: str, rank: int, ctm: str) -> None:
    """The out= kernels of every `F.interpolate` mode the lowering takes, and the repeat on a
    5-D tensor, write the resize's slot (the graph input is standard)."""
    lens = [1, 3] + [5, 6, 4][: rank - 2]
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = "floor"
    scales = np.array([1, 1] + [2] * (rank - 2), np.float32)
    feeds = {"x": RNG.standard_normal(lens).astype(np.float32)}
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    _compile_and_check(make_model([node], feeds, ["y"], {"scales": scales}), feeds)


def _c2f_model(order: tuple[str, ...], from_conv: bool) -> tuple:
    """A C2f block's join: h = conv(x) (or the graph input) split in halves lo/hi, m = conv(hi),
    Concat of `order` (names among "lo", "hi", "m")."""
    inits: dict = {"halves": np.array([4, 4], np.int64)}
    nodes: list = _conv("h", "x", 8, 8, inits) if from_conv else []
    source = "h" if from_conv else "x"
    nodes.append(helper.make_node("Split", [source, "halves"], ["lo", "hi"], axis=1))
    nodes += _conv("m", "hi", 4, 4, inits)
    nodes.append(helper.make_node("Concat", list(order), ["y"], axis=1))
    feeds = {"x": RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)}
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.parametrize("from_conv", [True, False], ids=["channels_last", "standard"])
@pytest.mark.parametrize(
    ("order", "copies"),
    [
        (("lo", "hi", "m"), 2),  # the halves in order: one copy of both
        (("hi", "lo", "m"), 3),  # out of order: apart
        (("lo", "m", "hi"), 3),  # not adjacent: apart
        (("lo", "hi", "lo", "hi"), 2),
    ],
)
def test_concat_of_consecutive_slices_copies_their_span_once(
    order: tuple[str, ...], copies: int, from_conv: bool
) -> None:
    from pygraphx.targets.torch_lowering.lower_layout import concat_axis, concat_parts

    model, feeds = _c2f_model(order, from_conv)
    prog = _compile_and_check(model, feeds)
    ctx = prog._executable.lowered.ctx
    (cat,) = [i for i in prog.get_main_module().instructions if i.op.name == "concat"]
    assert len(concat_parts(ctx, cat, concat_axis(cat))) == copies
    assert_profile_matches(prog, feeds)


@pytest.mark.parametrize("conv_output", ["torch", "arena"])
@pytest.mark.parametrize("order", ["us", "usu"])
def test_upsample_concat_in_both_conv_output_modes(order: str, conv_output: str) -> None:
    """The concat's step reads the upsample's input while it writes its own slot: in arena mode
    the plan keeps the two apart (`fused_reads` names the concat), so they merge; in either
    mode the outputs match ORT over two runs (a shared slot gave wrong values before)."""
    from pygraphx.targets.cpu.target import CpuTarget

    model, feeds = _model(order)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(conv_output=conv_output))
    for _ in range(2):
        for g, w in zip(prog.run(dict(feeds)), want, strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)
    if conv_output == "arena":
        assert ["resize", "concat"] in _fused_steps(prog)
