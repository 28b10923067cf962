"""swap_resize_convolution (helper unetb13): a 1x1 convolution (and its bias add) moved in front
of the upsampling resize that feeds it, only where the two commute exactly.

Oracle: ONNX Runtime at float32 on the same graph (float32 to rounding; bf16 at bf16's
tolerance after `quantize_bf16`). Each case also checks whether the rewrite happened: in the
compiled program the convolution's step must come before the resize's where the pass applies,
and after it where it must not (a shrink, a 3x3 or strided or grouped convolution, a cubic or
tf_crop_and_resize resize, a resize with a second user)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.passes.swap_resize_convolution import swap_resize_convolution  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(1313)
#: relative RMS error a bf16 program may show against float32 (compare.py's bf16 tolerance)
BF16_RMS = 3e-2


def _model(resize: dict, scales: list[float], conv: dict | None = None, kernel: int = 1,
           bias: bool = True, extra_user: bool = False, cin: int = 6, cout: int = 4,
           side: tuple[int, int] = (5, 7)):  # fmt: skip
    x = RNG.standard_normal((2, cin, *side)).astype(np.float32)
    conv = dict(conv or {})
    group = conv.get("group", 1)
    inits = {
        "scales": np.asarray(scales, np.float32),
        "w": (RNG.standard_normal((cout, cin // group, kernel, kernel)) / np.sqrt(cin))
        .astype(np.float32),
    }  # fmt: skip
    conv_in = ["r", "w"]
    if bias:
        inits["b"] = RNG.standard_normal(cout).astype(np.float32)
        conv_in.append("b")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Resize", ["a", "", "scales"], ["r"], **resize),
        helper.make_node("Conv", conv_in, ["y"], **conv),
    ]
    outputs = ["y", "r"] if extra_user else ["y"]
    return make_model(nodes, {"x": x}, outputs, inits, opset=19).SerializeToString(), {"x": x}


def _ort(model: bytes, feeds: dict) -> np.ndarray:
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _pgx(model: bytes, feeds: dict, bf16: bool = False) -> tuple[np.ndarray, bool]:
    """The program's first output and whether its convolution runs before its resize."""
    prog = pygraphx.parse_onnx_buffer(model)
    if bf16:
        pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(threads=1))
    assert not prog._executable.fallbacks, prog._executable.fallbacks
    out = np.asarray(prog.run(feeds)[0]).astype(np.float32)
    names = [
        {i.op.name for i in s.instructions if not i.is_literal()}
        for s in prog._executable.lowered.steps
    ]
    conv = min(k for k, n in enumerate(names) if "convolution" in n)
    resize = min(k for k, n in enumerate(names) if "resize" in n)
    return out, conv < resize


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


# (name, Resize attributes, scales)
SWAPPED = [
    ("linear_half_pixel_x2", {"mode": "linear"}, [1, 1, 2, 2]),
    ("linear_pytorch_half_pixel_x3",
     {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, [1, 1, 3, 3]),
    ("linear_align_corners_x2",
     {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, [1, 1, 2, 2]),
    ("linear_asymmetric_x2",
     {"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 2, 2]),
    ("linear_half_pixel_fractional", {"mode": "linear"}, [1, 1, 1.6, 2.5]),
    ("linear_one_axis", {"mode": "linear"}, [1, 1, 1, 2]),
    ("nearest_asymmetric_floor",
     {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
     [1, 1, 2, 2]),
    ("nearest_half_pixel_round", {"mode": "nearest"}, [1, 1, 1.5, 3]),
]  # fmt: skip


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("name", "resize", "scales"), SWAPPED, ids=[c[0] for c in SWAPPED])
def test_swapped_matches_ort_float32(name: str, resize: dict, scales: list, bias: bool) -> None:
    model, feeds = _model(resize, scales, bias=bias)
    want = _ort(model, feeds)
    got, conv_first = _pgx(model, feeds)
    assert conv_first, f"{name}: the 1x1 convolution was not moved before the resize"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("name", "resize", "scales"), SWAPPED[:4], ids=[c[0] for c in SWAPPED[:4]])
def test_swapped_matches_ort_bf16(name: str, resize: dict, scales: list) -> None:
    model, feeds = _model(resize, scales, cin=32, cout=16, side=(8, 8))
    want = _ort(model, feeds)
    got, conv_first = _pgx(model, feeds, bf16=True)
    assert conv_first, f"{name}: the 1x1 convolution was not moved before the resize"
    assert _rel(got, want) < BF16_RMS


# (name, Resize attributes, scales, Conv attributes, kernel, a second user of the resize)
KEPT = [
    ("shrink", {"mode": "linear"}, [1, 1, 0.5, 0.5], None, 1, False),
    ("shrink_one_axis", {"mode": "linear"}, [1, 1, 2, 0.5], None, 1, False),
    ("conv_3x3", {"mode": "linear"}, [1, 1, 2, 2], {"pads": [1, 1, 1, 1]}, 3, False),
    ("conv_1x1_stride2", {"mode": "linear"}, [1, 1, 2, 2], {"strides": [2, 2]}, 1, False),
    ("conv_1x1_padded", {"mode": "linear"}, [1, 1, 2, 2], {"pads": [1, 1, 1, 1]}, 1, False),
    ("conv_1x1_group2", {"mode": "linear"}, [1, 1, 2, 2], {"group": 2}, 1, False),
    ("cubic", {"mode": "cubic"}, [1, 1, 2, 2], None, 1, False),
    ("resize_has_another_user", {"mode": "linear"}, [1, 1, 2, 2], None, 1, True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "resize", "scales", "conv", "kernel", "extra"), KEPT, ids=[c[0] for c in KEPT]
)
def test_kept_matches_ort(name, resize, scales, conv, kernel, extra) -> None:  # noqa: ANN001
    model, feeds = _model(resize, scales, conv=conv, kernel=kernel, extra_user=extra)
    want = _ort(model, feeds)
    got, conv_first = _pgx(model, feeds)
    assert not conv_first, f"{name}: the convolution must stay after the resize"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_pass_rewrites_shapes_and_bias() -> None:
    """On the IR: conv(x) + broadcast(b) at the small size, then one resize to the old lens."""
    model, _ = _model({"mode": "linear"}, [1, 1, 2, 2])
    prog = pygraphx.parse_onnx_buffer(model)
    mod = prog.modules["main"]
    swap_resize_convolution(mod)
    ops = [i for i in mod.instructions if i.op.name in ("convolution", "add", "resize")]
    assert [i.op.name for i in ops] == ["convolution", "add", "resize"]
    conv, add, resize = ops
    assert conv.shape.lens() == [2, 4, 5, 7] and add.shape.lens() == [2, 4, 5, 7]
    assert resize.shape.lens() == [2, 4, 10, 14] and resize.inputs == [add]


def test_switch_keeps_old_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGX_DISABLE_PASSES", "swap_resize_convolution")
    model, feeds = _model({"mode": "linear"}, [1, 1, 2, 2])
    got, conv_first = _pgx(model, feeds)
    assert not conv_first
    np.testing.assert_allclose(got, _ort(model, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode, cin, cout, swapped", [
    ("nearest", 8, 8, False), ("nearest", 4, 16, False), ("nearest", 16, 8, True),
    ("linear", 8, 16, False), ("linear", 8, 8, True), ("linear", 16, 8, True),
])  # fmt: skip
def test_moves_only_where_it_gains(mode: str, cin: int, cout: int, swapped: bool) -> None:
    """After the swap the resize runs on the convolution's output channels: a nearest resize
    (about 4x a linear one's cost here) moves only where they are fewer, a linear one where
    they are not more; the results match ONNX Runtime either way."""
    model, feeds = _model({"mode": mode}, [1, 1, 2, 2], cin=cin, cout=cout)
    got, conv_first = _pgx(model, feeds)
    assert conv_first == swapped
    np.testing.assert_allclose(got, _ort(model, feeds), rtol=1e-5, atol=1e-5)
