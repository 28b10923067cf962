"""A bf16 program's fused convolutions and matrix products add their bias in float32, unrounded
(`quantize/wide_constants.py`: `quantize_bf16` keeps the float32 value of a rounded bias;
`conv_epilogue_match._channel_constant` / `gemm_kernels.bias_vector` read it and the kernels take a
float32 bias), as OpenVINO's bf16 convolutions and fully connected layers do.

The models isolate the bias: inputs and weights are exact in bf16 (so the products are the
float32 ones), the products have a large mean and the bias cancels it (batch normalisation's
mean folded into a convolution, ResNet-50's case), so rounding the bias to bf16 is most of the
error. Checked against ONNX Runtime at float32, with the bias kept and with `KEEP_WIDE` off (the
earlier rounding), which fails the bound.
"""

from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import pygraphx
from pygraphx.ir.argument import RoundedLiteral
from pygraphx.quantize import quantize_bf16
from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16
from tests.helpers import make_model
from tests.quantize.test_truncate_float import rel_rms

WIDE = importlib.import_module("pygraphx.quantize.wide_constants")
RNG = np.random.default_rng(15)
pytestmark = pytest.mark.skipif(not cpu_has_bf16(), reason="oneDNN has no bf16 kernels here")


def _bf16_exact(arr: np.ndarray) -> np.ndarray:
    return arr.astype(ml_dtypes.bfloat16).astype(np.float32)


def _conv_bn(rng: np.random.Generator = RNG) -> tuple:
    """Conv + BatchNormalization (scale 1, variance 1, epsilon 0: the weights stay exact) +
    Relu on inputs near 4, the normalisation's mean the products' own, then a 1x1 product (of
    more than `HEAD_ELEMENTS` values: bf16, so the first group is the convolution's epilogue)."""
    x = (4.0 + rng.integers(0, 128, (1, 16, 40, 40)) / 32).astype(np.float32)  # exact in bf16
    w1 = _bf16_exact(rng.standard_normal((32, 16, 3, 3)) / 12)
    inits = {
        "w1": w1,
        "s1": np.ones(32, np.float32),
        "b1": (0.1 * rng.standard_normal(32)).astype(np.float32),
        "m1": (6.0 * w1.sum(axis=(1, 2, 3))).astype(np.float32),
        "v1": np.ones(32, np.float32),
        "w2": _bf16_exact(rng.standard_normal((48, 32, 1, 1)) / 5.6),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c1", "s1", "b1", "m1", "v1"], ["n1"], epsilon=0.0
        ),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["y"]),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


def _dense() -> tuple:
    """MatMul + Add (a bias cancelling the products' mean) + Relu on 64 rows near 4, then a
    second product."""
    x = (4.0 + RNG.integers(0, 128, (64, 96)) / 32).astype(np.float32)
    w1 = _bf16_exact(RNG.standard_normal((96, 128)) / 9.8)
    inits = {
        "w1": w1,
        "b1": (-6.0 * w1.sum(axis=0) + 0.1 * RNG.standard_normal(128)).astype(np.float32),
        "w2": _bf16_exact(RNG.standard_normal((128, 32)) / 11.3),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["p1"]),
        helper.make_node("Add", ["p1", "b1"], ["q1"]),
        helper.make_node("Relu", ["q1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w2"], ["y"]),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


def _error(model, feeds, monkeypatch, keep: bool) -> float:
    monkeypatch.setattr(WIDE, "KEEP_WIDE", keep)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    quantize_bf16(prog)
    prog.compile(pygraphx.get_target("cpu"))
    got = np.asarray(prog.run(feeds)[0])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return rel_rms(got, sess.run(None, feeds)[0])


@pytest.mark.parametrize("build", [_conv_bn, _dense])
def test_bias_added_in_float32(build, monkeypatch) -> None:
    model, feeds = build()
    new, old = (_error(model, feeds, monkeypatch, keep) for keep in (True, False))
    print(f"{build.__name__}: kept {new:.3e}, rounded {old:.3e}")
    # kept: 2.4e-3 (conv) and 1.7e-3 (dense), the products' output rounding; rounded: 9.0e-3
    # and 1.0e-2
    assert new < 4e-3 < 6e-3 < old


@pytest.mark.slow
def test_resnet50_error_against_openvino_level(monkeypatch) -> None:
    """ResNet-50 (random weights, batch 1, `model_inputs` seed 0) against ONNX Runtime float32:
    1.49e-2 with the biases kept (OpenVINO's bf16: 1.54e-2), 1.73e-2 with them rounded."""
    from pygraphx.models import get_model, model_inputs

    model = get_model("resnet50", batch=1)
    feeds = model_inputs("resnet50", model, seed=0)
    new, old = (_error(model, feeds, monkeypatch, keep) for keep in (True, False))
    print(f"resnet50: kept {new:.3e}, rounded {old:.3e}")
    assert new < 1.6e-2 < old


@pytest.mark.parametrize("build", [_conv_bn, _dense])
def test_kept_bias_survives_save_and_load(build, tmp_path) -> None:
    """A saved bf16 program keeps its biases' float32 values: loaded, it computes the same numbers
    as before it was saved (not the rounded bias's)."""
    model, feeds = build()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    quantize_bf16(prog)
    prog.compile(pygraphx.get_target("cpu"))
    before = np.asarray(prog.run(feeds)[0])
    path = tmp_path / "prog.mxr"
    pygraphx.save(prog, str(path))
    loaded = pygraphx.load(str(path))
    kept = [
        ins.get_literal()
        for mod in loaded.modules.values()
        for ins in mod.instructions
        if ins.is_literal() and isinstance(ins.get_literal(), RoundedLiteral)
    ]
    assert kept, "the loaded program lost its rounded literals' float32 values"
    for lit in kept:
        assert lit.wide.dtype == np.float32 and lit.wide.shape == lit.array.shape
    after = np.asarray(loaded.run(feeds)[0])
    np.testing.assert_array_equal(after, before)


# hyg15: the routes that rounded the float32 bias back to bf16: torch's channels-last kernel
# (`conv_kernels._torch_cl`, now left out for such a layer), the concat sum chain
# (`conv_concat`) and the bf16 transposed convolution (`deconv_bf16`, both its kernels)


def _errors(model, feeds, monkeypatch, **settings) -> tuple:
    """(error with the biases kept, error with them rounded, the kept compile's lowered
    program: its steps, its lowering cache), both against ONNX Runtime at float32."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    out = []
    for keep in (True, False):
        monkeypatch.setattr(WIDE, "KEEP_WIDE", keep)
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        quantize_bf16(prog)
        prog.compile(pygraphx.get_target("cpu", **settings))
        out.append((rel_rms(np.asarray(prog.run(feeds)[0]), want), prog))
    (new, prog), (old, _) = out
    return new, old, prog._executable.lowered


def test_torch_cl_leaves_a_wide_bias_to_onednn(monkeypatch) -> None:
    """Forced onto `torch_cl` (`F.conv2d` takes no float32 bias with bf16 activations and
    rounds its product), the layer with a float32 bias runs on a oneDNN kernel instead, and
    the network gives the float32-bias answer (it gave the rounded one)."""
    from pygraphx.targets.torch_lowering import conv_choice

    conv_choice.clear_cache()
    new, old, _ = _errors(*_conv_bn(np.random.default_rng(15)), monkeypatch,
                          conv_kernel="torch_cl")  # fmt: skip
    print(f"torch_cl: kept {new:.3e}, rounded {old:.3e}")
    assert new < 4e-3 < 6e-3 < old


def test_torch_cl_refuses_a_wide_bias() -> None:
    import torch

    from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan, build_kernel, kernels_for

    w = torch.randn(8, 8, 3, 3).to(torch.bfloat16)
    plan = ConvPlan(w, w, [1, 8, 6, 6], [1, 1], [1, 1], [1, 1], 1, None, torch.randn(8))
    assert "torch_cl" not in kernels_for(plan)
    with pytest.raises(ValueError, match="float32 bias"):
        build_kernel(plan, "torch_cl", lambda: torch.zeros(1, 8, 6, 6, dtype=torch.bfloat16), None)
    plan.bias = plan.bias.to(torch.bfloat16)  # a rounded bias: torch_cl may run it
    assert "torch_cl" in kernels_for(plan)


def _concat_bn(up: bool = False) -> tuple:
    """Two channels-last parts, x itself (an identity 1x1 convolution: exact) and a small one
    (a convolution with zero-sum weights), concatenated into a 1x1 convolution + batch norm
    whose mean cancels the products (the first part's: the sum chain's first step adds the
    bias, so its rounded result stays small) + Relu, then a 1x1 product (of more than
    `HEAD_ELEMENTS` values, as `_conv_bn`'s). `up`: the first part is every other pixel of x
    (the identity at stride 2) upsampled x2 (nearest, YOLOv8's neck: the chain's upsample
    part, its convolution at the small size with the bias)."""
    rng = np.random.default_rng(151)
    x = (4.0 + rng.integers(0, 128, (1, 16, 40, 40)) / 32).astype(np.float32)
    half = _bf16_exact(rng.standard_normal((16, 8, 1, 1)) / 32)
    w2 = _bf16_exact(rng.standard_normal((32, 32, 1, 1)) / 8)
    inits = {
        "eye": np.eye(16, dtype=np.float32).reshape(16, 16, 1, 1),
        "wb": np.concatenate([half, -half], axis=1),  # rows summing to 0: small outputs
        "w2": w2,
        "s1": np.ones(32, np.float32),
        "b1": (0.1 * rng.standard_normal(32)).astype(np.float32),
        "m1": (6.0 * w2[:, :16].sum(axis=(1, 2, 3))).astype(np.float32),
        "v1": np.ones(32, np.float32),
        "w3": _bf16_exact(rng.standard_normal((48, 32, 1, 1)) / 5.6),
    }
    nodes = [helper.make_node("Conv", ["x", "wb"], ["b"])]
    if up:
        inits["scales"] = np.array([1, 1, 2, 2], np.float32)
        nodes += [
            helper.make_node("Conv", ["x", "eye"], ["a_half"], strides=[2, 2]),
            helper.make_node("Resize", ["a_half", "", "scales"], ["a"], mode="nearest",
                             coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        ]  # fmt: skip
    else:
        nodes.append(helper.make_node("Conv", ["x", "eye"], ["a"]))
    nodes += [
        helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w2"], ["c1"]),
        helper.make_node(
            "BatchNormalization", ["c1", "s1", "b1", "m1", "v1"], ["n1"], epsilon=0.0
        ),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w3"], ["y"]),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


@pytest.mark.parametrize("up", [False, True], ids=["parts", "upsample_part"])
def test_concat_sum_chain_adds_the_bias_in_float32(up, monkeypatch) -> None:
    from pygraphx.targets.torch_lowering import conv_concat, onednn_conv

    if not onednn_conv.available():
        pytest.skip("the sum chain runs on oneDNN's own library (onednn-cpu-gomp)")
    monkeypatch.setenv(conv_concat.MODE_ENV, "on")
    new, old, lowered = _errors(*_concat_bn(up), monkeypatch)
    print(f"concat (up {up}): kept {new:.3e}, rounded {old:.3e}")
    assert lowered.ctx.cache.get("conv_concat_sum") == 1, lowered.ctx.cache
    steps = [[i.op.name for i in s.instructions] for s in lowered.steps]
    head = ["resize", "concat", "convolution"] if up else ["concat", "convolution"]
    assert [*head, "pointwise"] in steps, steps  # the chain, its bias group fused
    assert new < 4e-3 < 6e-3 < old


def _deconv_bn() -> tuple:
    """ConvTranspose 2x2 stride 2 (each output pixel one input pixel's product: the weight
    the same at the four offsets) with a bias cancelling the products' mean + Relu, then a
    1x1 product."""
    rng = np.random.default_rng(152)
    x = (4.0 + rng.integers(0, 128, (1, 16, 20, 20)) / 32).astype(np.float32)
    w = _bf16_exact(rng.standard_normal((16, 32, 1, 1)) / 12)
    inits = {
        "wd": np.repeat(np.repeat(w, 2, axis=2), 2, axis=3),
        "bd": (-6.0 * w.sum(axis=(0, 2, 3)) + 0.1 * rng.standard_normal(32)).astype(np.float32),
        "w2": _bf16_exact(rng.standard_normal((48, 32, 1, 1)) / 5.6),
    }
    nodes = [
        helper.make_node("ConvTranspose", ["x", "wd", "bd"], ["d"], strides=[2, 2]),
        helper.make_node("Relu", ["d"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y"]),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


@pytest.mark.parametrize("kernel", ["bf16", "torch"])
def test_deconvolution_adds_the_bias_in_float32(kernel, monkeypatch) -> None:
    """Both bf16 deconvolution kernels (oneDNN's C API primitive, torch's op) add the kept
    bias in float32."""
    from pygraphx.targets.torch_lowering import deconv_bf16, onednn_capi

    monkeypatch.setenv(deconv_bf16.DECONV_ENV, kernel)
    new, old, lowered = _errors(*_deconv_bn(), monkeypatch)
    cache = lowered.ctx.cache
    print(f"deconv {kernel}: kept {new:.3e}, rounded {old:.3e}")
    capi = kernel == "bf16" and onednn_capi.runtime() is not None
    assert cache.get("deconv_capi", 0) == (1 if capi else 0), cache
    assert new < 4e-3 < 6e-3 < old
