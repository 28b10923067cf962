"""`quantize_int8` / `quantize_fp8` with `residuals=True` on the gpu target: a residual add's
other operand is quantised (`quantize/residual.py`), its dequantise becomes element-wise maths
inside the add's group (`passes/rewrite_dequantize.py`), and the last convolution of the block
reads the 8-bit residual in its epilogue and writes only the 8-bit result the next
convolution reads. The numbers are the `ref` target's on the same quantised program (on the
GPU when there is one, else the GPU lowering on CPU tensors under `TRITON_INTERPRET=1`)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import pygraphx  # noqa: E402
from pygraphx.passes.rewrite_dequantize import rewrite_dequantize  # noqa: E402
from pygraphx.quantize import QuantizeError  # noqa: E402
from pygraphx.targets.gpu.quant_conv import FP8_CONV_ENV  # noqa: E402
from tests.targets.gpu.test_gpu_quant_conv import (  # noqa: E402
    FP8_INEXACT_ON_GPU,
    _ref_and_gpu,
    _spy_epilogues,
    downsample_block_model,
    stem_and_block_model,
)


def _quantised(model, feeds, kind: str, fp16: bool, residuals: bool = True) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    quantize = getattr(pygraphx, f"quantize_{kind}")
    quantize(prog, "ref", [feeds(k) for k in range(1, 4)], residuals=residuals)
    if fp16:
        pygraphx.quantize_fp16(prog)
    return prog


def _names(prog: pygraphx.Program) -> list[str]:
    return [i.op.name for i in prog.get_main_module().instructions]


@pytest.mark.parametrize("model_of", [stem_and_block_model, downsample_block_model])
def test_residual_operand_is_quantised_where_the_add_follows_a_product(model_of) -> None:
    """One more quantise where the residual is not a product's input already (the shortcut
    product's output), none where it is (the block input); the add reads a dequantise."""
    model, feeds = model_of()
    plain = _quantised(model, feeds, "int8", False, residuals=False)
    both = _quantised(model, feeds, "int8", False)
    extra = 1 if model_of is downsample_block_model else 0
    assert _names(both).count("quantizelinear") == _names(plain).count("quantizelinear") + extra
    adds = [i for i in both.get_main_module().instructions if i.op.name == "add"]
    read = [x for a in adds for x in a.inputs if x.op.name == "dequantizelinear"]
    read = [x for x in read if x.inputs[0].op.name == "quantizelinear"]  # not a product's
    assert len(read) == 1, adds


def test_residuals_against_onnx_runtime() -> None:
    """The quantised residual costs little accuracy: the `ref` run of the residual program
    stays within 3% relative RMS of ONNX Runtime's float output, as the plain int8 one does."""
    ort = pytest.importorskip("onnxruntime")
    model, feeds = stem_and_block_model()
    model.ir_version = min(model.ir_version, 9)  # older runtimes read IR <= 9 / 13
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds(0))[0].astype(np.float64)
    for residuals in (False, True):
        prog = _quantised(model, feeds, "int8", False, residuals)
        prog.compile(pygraphx.get_target("ref"))
        got = np.asarray(prog.run(feeds(0))[0], np.float64)
        rel = np.sqrt(((got - want) ** 2).sum() / (want**2).sum())
        assert rel < 0.03, (residuals, rel)


def test_residuals_need_static_scales() -> None:
    model, feeds = stem_and_block_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    with pytest.raises(QuantizeError, match="residuals=True needs static scales"):
        pygraphx.quantize_int8(prog, "ref", [feeds(1)], dynamic=True, residuals=True)


def test_rewrite_dequantize_keeps_the_numbers() -> None:
    """The rewritten dequantise (convert, mul, convert) computes the `ref` numbers of
    `dequantizelinear` bit for bit, in a float32 and a half program."""
    model, feeds = stem_and_block_model()
    for fp16 in (False, True):
        want_prog = _quantised(model, feeds, "int8", fp16)
        got_prog = _quantised(model, feeds, "int8", fp16)
        before = _names(got_prog).count("dequantizelinear")
        rewrite_dequantize(got_prog.get_main_module())
        assert _names(got_prog).count("dequantizelinear") == before - 1
        for prog in (want_prog, got_prog):
            prog.compile(pygraphx.get_target("ref"))
        want = np.asarray(want_prog.run(feeds(0))[0])
        got = np.asarray(got_prog.run(feeds(0))[0])
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("model_of", [stem_and_block_model, downsample_block_model])
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_int8_residual_is_read_and_written_as_int8(model_of, fp16: bool, monkeypatch) -> None:
    """The block's last convolution takes the 8-bit residual with its scale
    ("residual_affine" on an int8 tensor) and writes only the int8 result; every convolution
    feeding another writes no float copy; the numbers are `ref`'s (exact int32 sums)."""
    monkeypatch.setenv("PGX_GPU_INT8_GEMM", "triton")
    calls: list = []
    real_seen = _spy_epilogues(monkeypatch)
    from pygraphx.targets.gpu import quant_conv_kernels as qck

    spy = qck.conv

    def outer(x, wt, scale, out, geometry, epilogue=None, residual=None, qout=None, **rows):
        calls.append((epilogue, None if residual is None else residual.dtype))
        return spy(x, wt, scale, out, geometry, epilogue, residual, qout, **rows)

    monkeypatch.setattr(qck, "conv", outer)
    model, feeds = model_of()
    ref, gpu = _quantised(model, feeds, "int8", fp16), _quantised(model, feeds, "int8", fp16)
    want, got = _ref_and_gpu(ref, gpu, feeds)
    assert ("bias", "residual_affine", "relu", "torch.int8") in {s[1:] for s in real_seen}
    fused = [(ep, dt) for ep, dt in calls if ep is not None and "residual_affine" in ep.ops]
    assert fused and all(dt == torch.int8 for _, dt in fused), calls
    quantising = [ep for ep, _ in calls if ep is not None and ep.quant_scale is not None]
    assert quantising and not any(ep.store for ep in quantising), calls
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@FP8_INEXACT_ON_GPU
def test_fp8_residual_is_read_as_fp8(fp16: bool, monkeypatch) -> None:
    """fp8: the same forms with fp8 e4m3 tensors; the numbers are `ref`'s on the program with
    `fold_fp8` applied (fp8 sums in float32, the scale on the sum)."""
    from pygraphx.passes.fold_fp8 import fold_fp8

    monkeypatch.setenv(FP8_CONV_ENV, "triton")
    seen = _spy_epilogues(monkeypatch)
    model, feeds = stem_and_block_model()
    ref, gpu = _quantised(model, feeds, "fp8", fp16), _quantised(model, feeds, "fp8", fp16)
    fold_fp8(ref.get_main_module())
    want, got = _ref_and_gpu(ref, gpu, feeds)
    qtype = "torch.float8_e4m3fn"
    assert ("bias", "residual_affine", "relu", qtype) in {s[1:] for s in seen}, seen
    rtol = 2e-3 if fp16 else 1e-5
    near = np.isclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())
    assert near.mean() > 0.99, near.mean()


def test_r8_tiles_answer_the_r8_form_on_an_h100_only() -> None:
    """`H100_R8_TABLE` answers convolutions reading an 8-bit residual on an H100; other forms
    and other devices keep their tables; each tile's K block divides the input channels and its
    column block fits the output channels (`_prune`'s rules)."""
    from pygraphx.targets.gpu import conv_tiles

    h100, h200 = "NVIDIA H100 80GB HBM3 | triton 3.6.0", "NVIDIA H200 | triton 3.6.0"
    for shape, tile in conv_tiles.H100_R8_TABLE.items():
        m, n, k, c = shape
        assert conv_tiles.table_tile(shape, h100, False, conv_tiles.R8) == tile
        assert conv_tiles.table_tile(shape, h100, True, conv_tiles.R8) == tile
        plain = conv_tiles.H100_TABLE.get(shape) or conv_tiles.TABLE.get(shape)
        assert conv_tiles.table_tile(shape, h100, False) == plain
        assert conv_tiles.table_tile(shape, h200, False, conv_tiles.R8) == conv_tiles.TABLE.get(
            shape
        )
        assert c % tile[2] == 0 and tile[1] < 2 * n, (shape, tile)
    key = conv_tiles.tile_key(False, 1, 100352, 256, 64, 64, conv_tiles.R8)
    assert key.endswith(":r8") and key != conv_tiles.tile_key(False, 1, 100352, 256, 64, 64)
