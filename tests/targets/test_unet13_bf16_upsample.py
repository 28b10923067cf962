"""bf16 upsampling on the `cpu` target (helper unet13): a bf16 ConvTranspose computed in bf16
on oneDNN with its bias / activation group fused (`torch_lowering/deconv_bf16.py`,
`PGX_CPU_BF16_DECONV`), and a bf16 linear Resize on oneDNN's resampling primitive
(`torch_lowering/onednn_resample.py`, `PGX_CPU_BF16_RESIZE`).

Oracle: ONNX Runtime in float32 on the same float32 graph; the pygraphx program is
`quantize_bf16`'d (the default "products" policy, what `--bf16` runs), so the tolerance is
bf16's. Each case also runs the old path (float32 compute / torch's kernel) and the new path's
error must not exceed the old one's by more than a small factor. The resampling primitive alone
is checked against ORT on bf16-representable inputs to within one bf16 rounding."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import (  # noqa: E402
    deconv_bf16,
    onednn_capi,
    onednn_resample,
)
from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16  # noqa: E402

pytestmark = pytest.mark.skipif(not cpu_has_bf16(), reason="no bf16 instructions on this CPU")

RNG_SEED = 13


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _ort(model: bytes, feeds: dict[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _pgx(model: bytes, feeds: dict[str, np.ndarray], cache: dict | None = None):
    """The bf16 program's output (float32) and each step's op names (`cache`: filled with the
    lowering's cache counters)."""
    prog = pygraphx.parse_onnx_buffer(model)
    pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(threads=1))
    assert not prog._executable.fallbacks, prog._executable.fallbacks
    out = np.asarray(prog.run(feeds)[0]).astype(np.float32)
    if cache is not None:
        cache.update(prog._executable.lowered.ctx.cache)
    steps = [
        [i.op.name for i in s.instructions if not i.is_literal()]
        for s in prog._executable.lowered.steps
    ]
    return out, steps


def _init(name: str, a: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(a.astype(np.float32), name)


# --- deconvolution ---------------------------------------------------------------------------

# (name, ConvTranspose attributes, kernel, input spatial, bias, activation after it)
DECONV_CASES = [
    ("unet_2x2_s2_bias", {"strides": [2, 2]}, 2, 8, True, None),
    ("k3_s2_pads_outpad", {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
     3, 7, True, None),
    ("k3_s2_groups2", {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 2}, 3, 6, True, None),
    ("k3_dilation2", {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, 3, 9, True, None),
    ("k3_s2_asym_pads", {"strides": [2, 2], "pads": [0, 1, 1, 0]}, 3, 5, True, None),
    ("k2_s2_no_bias_relu", {"strides": [2, 2]}, 2, 8, False, "Relu"),
    ("k2_s2_bias_relu", {"strides": [2, 2]}, 2, 8, True, "Relu"),
    ("k2_s2_groups4", {"strides": [2, 2], "group": 4}, 2, 6, True, None),
    ("k3_s2_dilation2_relu", {"strides": [2, 2], "dilations": [2, 2]}, 3, 5, True, "Relu"),
    ("k4_s2_pads_bias_clip", {"strides": [2, 2], "pads": [1, 1, 1, 1]}, 4, 6, True, "Clip"),
]  # fmt: skip


def _deconv_model(attrs: dict, k: int, hw: int, bias: bool, act: str | None, prefix: bool):
    """x -> [Conv 3x3 + ReLU] -> ConvTranspose(+B) -> [act] -> Concat with Conv1x1(skip) ->
    Conv 1x1: the UNet decoder's upsampling step, every value in bf16 under `quantize_bf16`."""
    rng = np.random.default_rng(RNG_SEED)
    cin, cout, cskip = 16, 12, 8
    groups = attrs.get("group", 1)
    inits, nodes = [], []
    src = "x"
    if prefix:
        inits += [_init("wc", rng.standard_normal((cin, cin, 3, 3)) * 0.2),
                  _init("bc", rng.standard_normal(cin) * 0.1)]  # fmt: skip
        nodes += [helper.make_node("Conv", ["x", "wc", "bc"], ["c"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", ["c"], ["cr"])]  # fmt: skip
        src = "cr"
    inits.append(_init("wt", rng.standard_normal((cin, cout // groups, k, k)) * 0.2))
    ins = [src, "wt"]
    if bias:
        inits.append(_init("bt", rng.standard_normal(cout) * 0.3))
        ins.append("bt")
    nodes.append(helper.make_node("ConvTranspose", ins, ["up"], **attrs))
    up = "up"
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["up"], ["upa"]))
        up = "upa"
    elif act == "Clip":
        inits += [_init("lo", np.array(0.0)), _init("hi", np.array(6.0))]
        nodes.append(helper.make_node("Clip", ["up", "lo", "hi"], ["upa"]))
        up = "upa"
    # the output size as ONNX defines it
    s = attrs.get("strides", [1, 1])[0]
    d = attrs.get("dilations", [1, 1])[0]
    p = attrs.get("pads", [0, 0, 0, 0])
    op_ = attrs.get("output_padding", [0, 0])
    ho = (hw - 1) * s + d * (k - 1) + 1 + op_[0] - p[0] - p[2]
    wo = (hw - 1) * s + d * (k - 1) + 1 + op_[1] - p[1] - p[3]
    inits += [_init("ws", rng.standard_normal((cskip, cskip, 1, 1)) * 0.3),
              _init("wo", rng.standard_normal((4, cout + cskip, 1, 1)) * 0.3)]  # fmt: skip
    nodes += [helper.make_node("Conv", ["skip", "ws"], ["sk"]),
              helper.make_node("Concat", [up, "sk"], ["cat"], axis=1),
              helper.make_node("Conv", ["cat", "wo"], ["y"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "deconv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, hw, hw]),
         helper.make_tensor_value_info("skip", TensorProto.FLOAT, [1, cskip, ho, wo])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((1, cin, hw, hw)).astype(np.float32),
             "skip": rng.standard_normal((1, cskip, ho, wo)).astype(np.float32)}  # fmt: skip
    return model.SerializeToString(), feeds


@pytest.mark.parametrize("kernel", ["bf16", "torch"])
@pytest.mark.parametrize("prefix", [True, False], ids=["after_conv", "from_input"])
@pytest.mark.parametrize("case", DECONV_CASES, ids=[c[0] for c in DECONV_CASES])
def test_bf16_deconvolution_against_ort(case, prefix, kernel, monkeypatch) -> None:
    _, attrs, k, hw, bias, act = case
    model, feeds = _deconv_model(attrs, k, hw, bias, act, prefix)
    want = _ort(model, feeds)
    monkeypatch.setenv(deconv_bf16.DECONV_ENV, "float32")
    old, old_steps = _pgx(model, feeds)
    monkeypatch.setenv(deconv_bf16.DECONV_ENV, kernel)
    plans = []
    real = deconv_bf16.Plan.__init__

    def spy(self, ctx, ins) -> None:
        plans.append(ins)
        real(self, ctx, ins)

    monkeypatch.setattr(deconv_bf16.Plan, "__init__", spy)
    cache: dict = {}
    new, new_steps = _pgx(model, feeds, cache)
    assert plans, "the bf16 deconvolution path was not taken"
    # oneDNN's C API primitive runs the uncropped ones (where its library is installed)
    cropped = bool(attrs.get("pads")) or bool(attrs.get("output_padding"))
    capi = kernel == "bf16" and not cropped and onednn_capi.runtime() is not None
    assert cache.get("deconv_capi", 0) == (1 if capi else 0), cache
    deconv_steps = [s for s in new_steps if "deconvolution" in s]
    assert len(deconv_steps) == 1
    if bias or act:  # the group after it (bias, activation) is folded into its step
        assert deconv_steps[0][-1] == "pointwise", new_steps
    assert [s for s in old_steps if "deconvolution" in s] == [["deconvolution"]]
    assert new.shape == want.shape
    err_new, err_old = _rel_err(new, want), _rel_err(old, want)
    assert err_new < 2e-2, (err_new, err_old)
    assert err_new <= 1.5 * err_old + 1e-3, (err_new, err_old)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(new, want, atol=0.05 * scale, rtol=0)


def test_deconv_switch_rejects_unknown(monkeypatch) -> None:
    monkeypatch.setenv(deconv_bf16.DECONV_ENV, "fp16")
    with pytest.raises(ValueError, match="PGX_CPU_BF16_DECONV"):
        deconv_bf16.mode()


def test_float32_deconvolution_untouched(monkeypatch) -> None:
    """A float32 ConvTranspose never takes the bf16 path."""
    model, feeds = _deconv_model({"strides": [2, 2]}, 2, 8, True, None, True)
    calls = []
    monkeypatch.setattr(deconv_bf16, "lower_alone", lambda *a: calls.append(a))
    monkeypatch.setattr(deconv_bf16, "fuse_group", lambda *a: calls.append(a))
    prog = pygraphx.parse_onnx_buffer(model)
    prog.compile(CpuTarget(threads=1))
    got = np.asarray(prog.run(feeds)[0])
    assert not calls
    np.testing.assert_allclose(got, _ort(model, feeds), rtol=1e-4, atol=1e-4)


# --- resize ----------------------------------------------------------------------------------

# (name, Resize attributes, scales or None, sizes or None, uses oneDNN)
RESIZE_CASES = [
    ("half_pixel_x2_scales", {"coordinate_transformation_mode": "half_pixel"},
     [1, 1, 2, 2], None, True),
    ("half_pixel_sizes_x1_5", {"coordinate_transformation_mode": "half_pixel"},
     None, [1, 16, 15, 12], True),
    ("pytorch_half_pixel_x2", {"coordinate_transformation_mode": "pytorch_half_pixel"},
     [1, 1, 2, 2], None, True),
    ("half_pixel_down_x0_5", {"coordinate_transformation_mode": "half_pixel"},
     [1, 1, 0.5, 0.5], None, True),
    ("half_pixel_x3_x2", {"coordinate_transformation_mode": "half_pixel"},
     [1, 1, 3, 2], None, True),
    ("align_corners_x2", {"coordinate_transformation_mode": "align_corners"},
     [1, 1, 2, 2], None, False),
    ("asymmetric_x2", {"coordinate_transformation_mode": "asymmetric"},
     [1, 1, 2, 2], None, False),
    ("half_pixel_sizes_13_17", {"coordinate_transformation_mode": "half_pixel"},
     None, [1, 16, 13, 17], True),  # sizes: the scales are output / input
    ("half_pixel_scale_1_7", {"coordinate_transformation_mode": "half_pixel"},
     [1, 1, 1.7, 1.7], None, False),  # 13 outputs from 8 at scale 1.7: not 13 / 8
]  # fmt: skip


def _resize_model(attrs: dict, scales, sizes):
    """x -> Conv 3x3 + ReLU -> Resize(linear) -> Conv 1x1: every value bf16 under
    `quantize_bf16`, the resize's input channels-last as in UNet-small's decoder."""
    rng = np.random.default_rng(RNG_SEED)
    c, hw = 16, 8
    inits = [_init("wc", rng.standard_normal((c, 3, 3, 3)) * 0.3),
             _init("bc", rng.standard_normal(c) * 0.1),
             _init("wo", rng.standard_normal((4, c, 1, 1)) * 0.3)]  # fmt: skip
    rs_in = ["cr", ""]
    if scales is not None:
        inits.append(_init("scales", np.array(scales)))
        rs_in.append("scales")
    else:
        rs_in += ["", "sizes"]
        inits.append(numpy_helper.from_array(np.array(sizes, dtype=np.int64), "sizes"))
    nodes = [helper.make_node("Conv", ["x", "wc", "bc"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["cr"]),
             helper.make_node("Resize", rs_in, ["r"], mode="linear", **attrs),
             helper.make_node("Conv", ["r", "wo"], ["y"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString(), {"x": rng.standard_normal((1, 3, hw, hw), dtype=np.float32)}


@pytest.mark.parametrize("case", RESIZE_CASES, ids=[c[0] for c in RESIZE_CASES])
def test_bf16_linear_resize_against_ort(case, monkeypatch) -> None:
    _, attrs, scales, sizes, onednn = case
    onednn = onednn and onednn_capi.runtime() is not None  # the optional library (`onednn`)
    # the resize as written (swap_resize_convolution would move the 1x1 conv in front of it and
    # make the resize the graph's NCHW output, which this test of its lowering does not want)
    monkeypatch.setenv("PGX_DISABLE_PASSES", "swap_resize_convolution")
    model, feeds = _resize_model(attrs, scales, sizes)
    want = _ort(model, feeds)
    monkeypatch.setenv(onednn_resample.KERNEL_ENV, "torch")
    old, _ = _pgx(model, feeds)
    monkeypatch.setenv(onednn_resample.KERNEL_ENV, "onednn")
    made = []
    real = onednn_resample.Resample.__init__

    def spy(self, rt, plan) -> None:
        made.append(plan)
        real(self, rt, plan)

    monkeypatch.setattr(onednn_resample.Resample, "__init__", spy)
    new, _ = _pgx(model, feeds)
    assert bool(made) == onednn, made
    assert new.shape == want.shape
    err_new, err_old = _rel_err(new, want), _rel_err(old, want)
    assert err_new < 2e-2, (err_new, err_old)
    assert err_new <= 1.5 * err_old + 1e-3, (err_new, err_old)


@pytest.mark.parametrize("shape,out", [((1, 8, 6, 5), (1, 8, 12, 10)),
                                       ((1, 8, 6, 5), (1, 8, 10, 7)),
                                       ((2, 32, 7, 9), (2, 32, 21, 18)),
                                       ((1, 24, 16, 16), (1, 24, 8, 8))])  # fmt: skip
def test_resampling_primitive_within_one_rounding(shape, out) -> None:
    """oneDNN's bf16 resampling on bf16 inputs against ORT's float32 Resize (half_pixel) of the
    same values: each output within one bf16 rounding (2^-8 relative) of ORT's."""
    rt = onednn_resample.runtime()
    if rt is None:
        pytest.skip("oneDNN's C API library is not installed")
    rng = np.random.default_rng(RNG_SEED)
    x = torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).bfloat16()
    xl = x.contiguous(memory_format=torch.channels_last)
    y = torch.empty(out, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    onednn_resample.Resample(rt, onednn_resample.ResamplePlan(shape, out, torch.bfloat16))(xl, y)
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear",
                            coordinate_transformation_mode="half_pixel")  # fmt: skip
    graph = helper.make_graph(
        [node], "r", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(out, dtype=np.int64), "sizes")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want = _ort(model.SerializeToString(), {"x": x.float().numpy()})
    got = y.float().numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2.0**-8, atol=1e-6)
    assert not np.array_equal(got, np.zeros_like(got))
