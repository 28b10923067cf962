"""`PGX_GPU_QUANTISE=reciprocal`: the 8-bit convolutions' quantising epilogue multiplies by the
scale's reciprocal (`quant_conv_kernels.RECIP`, TensorRT's arithmetic) instead of the exact
quotient: its codes are those of `rne(y * float32(1 / s))` (numpy / torch here, the oracle),
within one step of the exact codes, and differ from them only next to a rounding boundary; the
setting is said once; an unknown value is an error naming the variable. On the GPU when there
is one, else under `TRITON_INTERPRET=1`."""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402
from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402
from pygraphx.targets.gpu import quantise_kernels as qe  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F8 = torch.float8_e4m3fn


def _conv(qtype: str, qs: float):
    """(the float result, the epilogue's 8-bit codes) of a 3x3 int8 convolution + bias + ReLU
    quantised with scale `qs`."""
    gen = torch.Generator().manual_seed(3)
    n, c, h, w, c_out = 2, 64, 6, 5, 48
    x = torch.randint(-128, 128, (n, c, h, w), dtype=torch.int8, generator=gen)
    weight = torch.randint(-128, 128, (c_out, c, 3, 3), dtype=torch.int8, generator=gen)
    x_cl = x.contiguous(memory_format=torch.channels_last).to(DEVICE)
    wt = weight.permute(0, 2, 3, 1).reshape(c_out, -1).contiguous().to(DEVICE)
    scale = (torch.rand(c_out, generator=gen) * 1e-4).to(DEVICE)
    bias = torch.randn(c_out, generator=gen).to(DEVICE)
    scale_q = torch.tensor([qs], dtype=torch.float32, device=DEVICE)
    qdtype = torch.int8 if qtype == "int8" else torch.uint8
    out = torch.empty((n * h * w, c_out), dtype=torch.float16, device=DEVICE)
    q = torch.empty((n * h * w, c_out), dtype=qdtype, device=DEVICE)
    ep = qk.Epilogue(["bias", "relu"], bias, scale_q)
    qck.conv(x_cl, wt, scale, out, (3, (1, 1), (1, 1), (1, 1), h, w), ep, None, q)
    return out, q, scale_q


@pytest.mark.parametrize("qtype", ["int8", "fp8"])
def test_reciprocal_quantise_is_the_product_by_the_reciprocal(qtype: str, monkeypatch, caplog):
    monkeypatch.setenv(qck.QUANTISE_ENV, "reciprocal")
    monkeypatch.setenv(qe.FP8_CAST_ENV, "0")
    monkeypatch.setattr(qck, "_said", set())
    with caplog.at_level(logging.WARNING, logger="pygraphx.gpu"):
        out, q, scale_q = _conv(qtype, 0.0213)
        _conv(qtype, 0.0213)
    assert sum("PGX_GPU_QUANTISE=reciprocal" in r.getMessage() for r in caplog.records) == 1
    y = out.float().cpu()
    r = torch.tensor(1.0, dtype=torch.float32) / scale_q.cpu()  # float32 division: RN(1/s)
    v = y * r
    if qtype == "int8":
        want = torch.round(v).clamp(-128, 127).to(torch.int8)  # round half to even
        np.testing.assert_array_equal(q.cpu().numpy(), want.numpy())
        exact = torch.empty_like(q)
        qe.quantise_int8(out, scale_q, exact)
        diff = (q.cpu().int() - exact.cpu().int()).abs()
        assert diff.max() <= 1
        boundary = (v - torch.floor(v) - 0.5).abs() <= v.abs() * 2**-20
        assert bool((boundary | (diff == 0)).all())  # differences only next to a boundary
    else:
        want = v.clamp(-448, 448).to(F8).view(torch.uint8)
        np.testing.assert_array_equal(q.cpu().numpy(), want.numpy())


def test_exact_is_the_default_and_unknown_values_are_refused(monkeypatch) -> None:
    monkeypatch.delenv(qck.QUANTISE_ENV, raising=False)
    assert qck.reciprocal_quantise() is False
    out, q, scale_q = _conv("int8", 0.0213)
    exact = torch.empty_like(q)
    qe.quantise_int8(out, scale_q, exact)
    np.testing.assert_array_equal(q.cpu().numpy(), exact.cpu().numpy())
    monkeypatch.setenv(qck.QUANTISE_ENV, "fast")
    with pytest.raises(ValueError, match="PGX_GPU_QUANTISE"):
        qck.reciprocal_quantise()
