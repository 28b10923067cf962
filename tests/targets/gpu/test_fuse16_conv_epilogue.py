"""Convolutions fused with their bias / residual add / ReLU group on the gpu target
(`targets/gpu/conv_epilogue.py`), checked against ONNX Runtime (float32) and torch.

On the CPU the `triton` form runs (`PGX_GPU_CONV_EPILOGUE=triton`, Triton's interpreter);
on a CUDA device the `auto` and `cudnn` forms run too (fp16, channels-last, batch 4)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
ort = pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.gpu import conv_epilogue as ce  # noqa: E402
from pygraphx.targets.gpu.target import GpuTarget  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(16)
CUDA = torch.cuda.is_available()


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def block_model(kind: str, n: int = 2, c: int = 8, hw: int = 6):
    """A stem conv(bias) -> relu giving `r` (a value in the convolutions' layout), then on
    `r`: `relu`: conv(bias) -> relu; `residual`: relu(conv(bias) + r); `downsample`:
    relu(conv(bias) + conv_shortcut(bias)); `bias`: conv(bias) + r, no relu; then a 1x1
    conv with no bias (so in fp16 the block's group is no output's convert). Two fusable
    convolutions each (the downsample's shortcut runs alone, its bias in the other's)."""
    x = RNG.standard_normal((n, 3, hw, hw)).astype(np.float32)
    inits = {"w0": _w(c, 3, 3, 3), "b0": RNG.standard_normal(c).astype(np.float32)}
    inits.update(w=_w(c, c, 3, 3), b=RNG.standard_normal(c).astype(np.float32), wt=_w(c, c, 1, 1))
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r"]),
        helper.make_node("Conv", ["r", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
    ]
    if kind == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif kind in ("residual", "bias"):
        last = "y" if kind == "bias" else "s"
        nodes.append(helper.make_node("Add", ["c", "r"], [last]))
        if kind == "residual":
            nodes.append(helper.make_node("Relu", ["s"], ["y"]))
    else:  # downsample: both branches' biases end up in one convolution's
        inits.update(ws=_w(c, c, 1, 1), bs=RNG.standard_normal(c).astype(np.float32))
        nodes += [
            helper.make_node("Conv", ["r", "ws", "bs"], ["sc"]),
            helper.make_node("Add", ["c", "sc"], ["s"]),
            helper.make_node("Relu", ["s"], ["y"]),
        ]
    nodes.append(helper.make_node("Conv", ["y", "wt"], ["out"]))
    return make_model(nodes, {"x": x}, ["out"], inits), {"x": x}


def ort_output(model, feeds) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def compiled(model, fp16: bool = False, bf16: bool = False, **settings) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    if fp16:
        pygraphx.quantize_fp16(prog)
    if bf16:
        pygraphx.quantize_bf16(prog, ("all",))  # residual sums in bf16 too
    device = {} if CUDA else {"device": "cpu"}
    prog.compile(GpuTarget(**device, **settings), offload_copy=True)
    return prog


def fused_forms(prog: pygraphx.Program) -> dict[str, int]:
    return dict(prog._executable.lowered.ctx.cache.get("conv_epilogue", {}))


@pytest.mark.parametrize("kind", ["relu", "residual", "downsample", "bias"])
@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
def test_triton_form_matches_ort(monkeypatch, kind: str, channels_last: bool) -> None:
    monkeypatch.setenv(ce.EPILOGUE_ENV, "triton")
    model, feeds = block_model(kind)
    prog = compiled(model, channels_last=channels_last)
    assert fused_forms(prog) == {"triton": 2}
    got = np.asarray(prog.run(feeds)[0])
    np.testing.assert_allclose(got, ort_output(model, feeds), rtol=1e-4, atol=1e-4)


def test_off_keeps_the_separate_group(monkeypatch) -> None:
    monkeypatch.setenv(ce.EPILOGUE_ENV, "off")
    model, feeds = block_model("residual")
    prog = compiled(model)
    assert fused_forms(prog) == {}
    got = np.asarray(prog.run(feeds)[0])
    np.testing.assert_allclose(got, ort_output(model, feeds), rtol=1e-4, atol=1e-4)


def test_a_bad_mode_names_the_variable(monkeypatch) -> None:
    monkeypatch.setenv(ce.EPILOGUE_ENV, "fast")
    with pytest.raises(ValueError, match=ce.EPILOGUE_ENV):
        ce.epilogue_mode()


def test_cudnn_declines_rocm_cpu_and_no_relu(monkeypatch) -> None:
    epi = ce.Epilogue(None, None, relu=True)
    assert not ce.cudnn_applies(torch.device("cpu"), epi)
    assert not ce.cudnn_applies(torch.device("cuda"), ce.Epilogue(None, None, relu=False))
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert not ce.cudnn_applies(torch.device("cuda"), epi)


@pytest.mark.parametrize("fmt", ["channels_last", "standard", "mismatched"])
def test_in_place_epilogue_matches_torch(caplog, fmt: str) -> None:
    device = "cuda" if CUDA else "cpu"
    y = torch.randn(2, 5, 3, 4, device=device)
    z = torch.randn(2, 5, 3, 4, device=device)
    if fmt != "standard":
        y = y.contiguous(memory_format=torch.channels_last)
    if fmt == "channels_last":
        z = z.contiguous(memory_format=torch.channels_last)
    bias = torch.randn(5, device=device)
    want = torch.relu(y + bias.view(1, 5, 1, 1) + z)
    with caplog.at_level(logging.WARNING, logger=ce.__name__):
        ce.epilogue_in_place(y, bias, z, relu=True)
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)
    assert ("in-place ops" in caplog.text) == (fmt == "mismatched")


@pytest.mark.parametrize("mode", ["auto", "cudnn", "triton"])
@pytest.mark.parametrize("kind", ["relu", "residual", "downsample"])
def test_fp16_forms_match_ort(monkeypatch, mode: str, kind: str) -> None:
    """On the CPU the `triton` form only (cuDNN's and the timing need a device)."""
    if not CUDA and mode != "triton":
        pytest.skip("needs a CUDA/ROCm device")
    monkeypatch.setenv(ce.EPILOGUE_ENV, mode)
    model, feeds = block_model(kind, n=4, c=32, hw=14) if CUDA else block_model(kind, c=16)
    prog = compiled(model, fp16=True)
    forms = fused_forms(prog)
    rocm = torch.version.hip is not None
    if rocm and mode != "triton":  # no cuDNN fused op: the groups stay apart
        assert forms == {}
    elif mode != "auto":
        assert forms == {mode: 2}
    else:
        assert sum(forms.values()) == 2
    got = np.asarray(prog.run(feeds)[0], dtype=np.float32)
    np.testing.assert_allclose(got, ort_output(model, feeds), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kind", ["residual", "downsample"])
@pytest.mark.parametrize("precision", ["bf16", "tf32"])
def test_bf16_and_tf32_match_ort(monkeypatch, kind: str, precision: str) -> None:
    """bf16 (`auto` on a device: a form cuDNN refuses is timed out, not chosen; the `triton`
    form on the CPU) and, on a device, float32 with TF32 (channels-last), against ORT."""
    bf16 = precision == "bf16"
    if not CUDA and not bf16:
        pytest.skip("TF32 needs a CUDA device")
    monkeypatch.setenv(ce.EPILOGUE_ENV, "auto" if CUDA else "triton")
    model, feeds = block_model(kind, n=4, c=32, hw=14) if CUDA else block_model(kind, c=16)
    prog = compiled(model, bf16=bf16, **({} if bf16 else {"tf32": True}))
    assert sum(fused_forms(prog).values()) == 2
    got = np.asarray(prog.run(feeds)[0], dtype=np.float32)
    tol = 8e-2 if bf16 else 1e-2
    np.testing.assert_allclose(got, ort_output(model, feeds), rtol=tol, atol=tol)


def test_auto_leaves_a_group_cudnn_cannot_take_apart(monkeypatch) -> None:
    """A group with no ReLU (or any group on ROCm / the CPU) is not fused by `auto`."""
    monkeypatch.setenv(ce.EPILOGUE_ENV, "auto")
    model, feeds = block_model("bias")
    prog = compiled(model)
    forms = fused_forms(prog)
    cudnn = CUDA and torch.version.hip is None
    assert sum(forms.values()) == (1 if cudnn else 0)  # the stem's conv + bias + ReLU only
    got = np.asarray(prog.run(feeds)[0])
    np.testing.assert_allclose(got, ort_output(model, feeds), rtol=1e-4, atol=1e-4)
