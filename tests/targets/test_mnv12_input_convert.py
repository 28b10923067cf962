"""A float32 input converted to bf16 for convolutions only runs as one oneDNN reorder
(`input_convert.py`): float32 NCHW -> bf16 channels-last in the convert's arena slot.

Oracle: ml_dtypes' bf16 rounding (round to nearest even) of the input for the values the
convolution reads (an identity 1x1 convolution gives them back exactly), ONNX Runtime's
float32 results within bf16's error for a real network; a convert with another user keeps the
element-wise torch step.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import input_convert, onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (onednn_conv.available() and cpu_has_bf16()),
    reason="needs oneDNN's C API library (onednn-cpu-gomp) and a CPU with bf16 instructions",
)


def _identity_conv_model(c: int, h: int, w: int, also_relu: bool = False) -> onnx.ModelProto:
    """x (1, c, h, w) float32 -> 1x1 convolution with the identity weight -> y; `also_relu`:
    x feeds a Relu too (a second output), so its convert has a user that is no convolution."""
    weight = np.eye(c, dtype=np.float32).reshape(c, c, 1, 1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, h, w])]
    if also_relu:
        nodes.append(helper.make_node("Relu", ["x"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, c, h, w]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
        outputs,
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _compiled(model: onnx.ModelProto) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog, ["all"])
    prog.compile(CpuTarget(threads=1))
    return prog


def _hard_values(shape: tuple[int, ...]) -> np.ndarray:
    """float32 values whose bf16 rounding is not a plain truncation: ties (to even, up and
    down), values just above and below a tie, signs, and the normal range's ends."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    bits = x.view(np.uint32)
    kinds = rng.integers(0, 4, size=x.shape)
    low = np.array([0x8000, 0x7FFF, 0x8001, 0x18000], dtype=np.uint32)[kinds]
    bits = (bits & np.uint32(0xFFFF0000)) | (low & np.uint32(0xFFFF))
    bits = np.where(kinds == 3, bits | np.uint32(0x10000), bits)  # odd bf16 + tie: rounds up
    x = bits.view(np.float32).copy()
    x.flat[:4] = [1e-30, -3.0e38, 3.0e38, 0.0]
    return x


@pytest.mark.parametrize("c,h,w", [(3, 9, 7), (16, 5, 5)])
def test_reorder_rounds_as_ml_dtypes(c: int, h: int, w: int) -> None:
    prog = _compiled(_identity_conv_model(c, h, w))
    assert prog._executable.lowered.ctx.cache.get("input_convert") == 1
    x = _hard_values((1, c, h, w))
    got = np.asarray(prog.run({"x": x})[0])
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    # the caller's array is read, not changed; a second run with other values is right too
    x2 = -_hard_values((1, c, h, w))
    got2 = np.asarray(prog.run({"x": x2})[0])
    np.testing.assert_array_equal(got2, x2.astype(ml_dtypes.bfloat16).astype(np.float32))


@pytest.mark.parametrize("layout", ["channels_last", "strided"])
def test_other_input_layouts(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A channels-last float32 source takes the NHWC reorder, any other layout a dense copy
    first; both give the bf16 values of the logical tensor."""
    prog = _compiled(_identity_conv_model(5, 6, 7))
    used: list[int] = []
    get = input_convert._Reorders.get
    monkeypatch.setattr(
        input_convert._Reorders, "get", lambda self, tag: used.append(tag) or get(self, tag)
    )
    if layout == "channels_last":
        x = np.ascontiguousarray(_hard_values((1, 5, 6, 7)).transpose(0, 2, 3, 1))
        x = x.transpose(0, 3, 1, 2)  # (1, 5, 6, 7), NHWC in memory
    else:
        x = _hard_values((1, 5, 6, 14))[..., ::2]
    assert not x.flags.c_contiguous
    got = np.asarray(prog.run({"x": x})[0])
    np.testing.assert_array_equal(got, x.astype(ml_dtypes.bfloat16).astype(np.float32))
    want_tags = [input_convert.TAG_NHWC] if layout == "channels_last" else []
    assert used == want_tags


def test_other_user_keeps_the_torch_step() -> None:
    prog = _compiled(_identity_conv_model(3, 4, 4, also_relu=True))
    assert prog._executable.lowered.ctx.cache.get("input_convert") is None
    x = _hard_values((1, 3, 4, 4))
    y, r = (np.asarray(a) for a in prog.run({"x": x}))
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(r, np.maximum(want, 0))


def test_switch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(input_convert.ENV, "torch")
    prog = _compiled(_identity_conv_model(3, 5, 5))
    assert prog._executable.lowered.ctx.cache.get("input_convert") is None
    x = _hard_values((1, 3, 5, 5))
    got = np.asarray(prog.run({"x": x})[0])
    np.testing.assert_array_equal(got, x.astype(ml_dtypes.bfloat16).astype(np.float32))


@pytest.mark.parametrize("threads", [1, 2])
def test_mobilenetv2_bf16_against_ort(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bf16 network within bf16's error of ONNX Runtime's float32 (random weights: 3.7e-2
    relative RMS either way), and the same bits as with the torch step (both round the image
    to nearest even)."""
    ort = pytest.importorskip("onnxruntime")
    from pygraphx.models import get_model, model_inputs

    model = get_model("mobilenetv2", batch=1)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs("mobilenetv2", model).items()}
    got = {}
    # the bf16 stem converts the image as it reads it (mnv18): off, so that the reorder runs
    monkeypatch.setenv("PGX_CPU_NATIVE_MBSTEM_BF16", "0")
    for setting in ("onednn", "torch"):
        monkeypatch.setenv(input_convert.ENV, setting)
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=threads))
        used = prog._executable.lowered.ctx.cache.get("input_convert")
        assert used == (1 if setting == "onednn" else None)
        got[setting] = np.asarray(prog.run(feeds)[0], dtype=np.float64)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0].astype(np.float64)
    rel_rms = np.sqrt(np.mean((got["onednn"] - want) ** 2) / np.mean(want**2))
    assert rel_rms < 6e-2, rel_rms
    np.testing.assert_array_equal(got["onednn"], got["torch"])


def test_the_documented_overflow_difference() -> None:
    """The one difference from the IR's clamping convert (see `input_convert`'s docstring): a
    finite float32 that rounds past bf16's largest value becomes an infinity here; the ref
    target clamps it. Below that bound both give the same value. (One overflowing value a run,
    first: oneDNN's kernel for one input channel also reads the next pixels with zero weights,
    and 0 x infinity is NaN, whichever conversion ran.)"""
    model = _identity_conv_model(1, 2, 3)
    prog = _compiled(model)
    ref = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(ref, ["all"])
    ref.compile(pygraphx.get_target("ref"))
    bf16_max = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    for sign in (1.0, -1.0):
        x = np.full((1, 1, 2, 3), 1.0, np.float32)
        x[0, 0, 0, 0] = np.float32(sign * 3.4e38)  # rounds past bf16's max (3.3895e38)
        x[0, 0, 1, 2] = np.float32(sign * 3.38e38)  # within range: the same bf16 value
        got = np.asarray(prog.run({"x": x})[0])
        want = np.asarray(ref.run({"x": x})[0])
        assert want[0, 0, 0, 0] == sign * bf16_max
        assert got[0, 0, 0, 0] == sign * np.inf
        assert got[0, 0, 1, 2] == want[0, 0, 1, 2] and np.isfinite(got[0, 0, 1, 2])
        np.testing.assert_array_equal(got.reshape(-1)[1:], want.reshape(-1)[1:])
