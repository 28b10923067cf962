"""A bf16 program's float32 residual sum `float(x @ w + b) + r` accumulates the bf16 product in
float32 into `r` (`gemm_residual.widened_residual_sum`: oneDNN's matmul, bf16 source and weight,
float32 destination, sum post-op; helper gemm15), against float64 torch and ONNX Runtime float32;
`PGX_CPU_GEMM_RESIDUAL_BF16=0` keeps the bf16 product and the separate widening add. Shapes with
N and K not multiples of 16, batch 1 and 3, 1 and 2 threads; residuals read later, returned or
read by the product itself are not overwritten."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import (  # noqa: E402
    gemm_kernels,
    gemm_residual,
    lower_gemm,
    onednn_linear,
)
from pygraphx.targets.torch_lowering.onednn_capi import OneDnnError  # noqa: E402
from tests.targets.test_gemm14_residual import block  # noqa: E402

pytestmark = [
    pytest.mark.skipif(
        not onednn_linear.available(), reason="needs oneDNN's C API library (onednn-cpu-gomp)"
    ),
    pytest.mark.skipif(
        not gemm_kernels.cpu_has_bf16(), reason="needs a CPU with native bf16 products"
    ),
]
D, F = 45, 83


@pytest.fixture(params=[1, 2])
def torch_threads(request: pytest.FixtureRequest):
    """The thread count the kernel sees (torch's, which oneDNN reads when it runs)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("with_bias", [True, False])
def test_widened_sum_against_float64(with_bias: bool, torch_threads: int) -> None:
    """bf16 x bf16 accumulated in float32 into a float32 residual: within float32 roundings of
    float64 (no bf16 rounding of the product: an error of 1e-5, not bf16's 4e-3)."""
    torch.manual_seed(15)
    rows, k, n = 37, F, D
    w = (torch.randn(k, n) / 8).to(torch.bfloat16)
    x = torch.randn(rows, k).to(torch.bfloat16)
    r = torch.randn(rows, n) * 4
    b = torch.randn(n).to(torch.bfloat16) if with_bias else None
    ref = x.double() @ w.double() + r.double() + (0 if b is None else b.double())
    acc = onednn_linear.Linear(w, b, rows, residual="sum", out_dtype=torch.float32)
    r_in = r.clone()
    got = acc.into(x, r_in)
    assert got.data_ptr() == r_in.data_ptr() and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=2e-5, atol=2e-5)
    # the plain product with a float32 result: the same, without the residual
    plain = onednn_linear.Linear(w, b, rows, out_dtype=torch.float32)(x)
    assert plain.dtype == torch.float32
    torch.testing.assert_close(plain.double(), ref - r.double(), rtol=2e-5, atol=2e-5)


def test_widened_sum_errors() -> None:
    w = torch.randn(8, 6).to(torch.bfloat16)
    with pytest.raises(OneDnnError, match="result type"):
        onednn_linear.Linear(w, None, 4, out_dtype=torch.float64)
    acc = onednn_linear.Linear(w, None, 4, residual="sum", out_dtype=torch.float32)
    with pytest.raises(OneDnnError, match="sum into: expected a dense"):
        acc.into(torch.randn(4, 8).to(torch.bfloat16), torch.randn(4, 6).to(torch.bfloat16))


def run(monkeypatch, model, x, threads: int, places: list | None = None) -> tuple[list, list, int]:
    """The bf16 program's outputs, ORT float32's, and how many widened sums a run makes
    (`places`: each widened sum's in-place flag, in lowering order)."""
    calls = []
    into = onednn_linear.Linear.into
    emit = gemm_residual.emit_residual_sum

    def emitting(*args, **kwargs):
        if places is not None and args[7]:
            places.append(args[8])
        return emit(*args, **kwargs)

    monkeypatch.setattr(lower_gemm, "emit_residual_sum", emitting)

    def counting(self, a, r):
        if self.dtype == torch.bfloat16 and r.dtype == torch.float32:
            calls.append(tuple(a.shape))
        return into(self, a, r)

    monkeypatch.setattr(onednn_linear.Linear, "into", counting)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(threads=threads))
    calls.clear()
    got = prog.run({"x": x})
    per_run = len(calls)
    got2 = prog.run({"x": x})  # a second run: the same (nothing kept from the first)
    for a, b in zip(got, got2, strict=True):
        np.testing.assert_array_equal(a, b)
    return got, want, per_run


def rel_err(got: list, want: list) -> float:
    pairs = [
        (np.asarray(g, np.float64), w.astype(np.float64)) for g, w in zip(got, want, strict=True)
    ]
    return max(float(np.sqrt(((g - w) ** 2).mean() / (w**2).mean())) for g, w in pairs)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_block_widened_sums_against_ort(monkeypatch, batch: int, threads: int) -> None:
    """Both residual sums of the post-norm block accumulate in float32; the error against ORT
    float32 is bf16's and no larger than the old route's."""
    model, x = block(batch)
    places: list = []
    got, want, calls = run(monkeypatch, model, x, threads, places)
    assert calls == 2 and places == [True, True]
    err = rel_err(got, want)
    assert err < 2e-2
    monkeypatch.setenv(gemm_residual.WIDENED_ENV, "0")
    old, _, old_calls = run(monkeypatch, model, x, threads)
    assert old_calls == 0
    assert err <= rel_err(old, want) * 1.1 + 1e-4


@pytest.mark.parametrize("setting", [(gemm_residual.WIDENED_ENV, "off"),
                                     (gemm_residual.RESIDUAL_ENV, "off")])  # fmt: skip
def test_switches_off(monkeypatch, setting: tuple[str, str]) -> None:
    monkeypatch.setenv(*setting)
    model, x = block(3)
    got, want, calls = run(monkeypatch, model, x, 1)
    assert calls == 0
    assert rel_err(got, want) < 2e-2


@pytest.mark.parametrize("expose", ["y", "late", "self"])
def test_residual_read_later_is_not_overwritten(monkeypatch, expose: str) -> None:
    """y returned or read after the product: that product accumulates into a copy of y (not in
    place), the other one into its residual, and every output (y too) matches ORT. `self` (the
    product reads y): in a bf16 program it reads y's bf16 copy, another tensor, so both go in
    place (y's float32 tensor is read by nothing after the sum)."""
    model, x = block(3, expose)
    places: list = []
    got, want, calls = run(monkeypatch, model, x, 2, places)
    assert calls == 2
    assert places == ([True, True] if expose == "self" else [False, True])
    assert rel_err(got, want) < 2e-2
    monkeypatch.setenv(gemm_residual.WIDENED_ENV, "0")
    old, _, _ = run(monkeypatch, model, x, 2)
    assert rel_err(got, want) <= rel_err(old, want) * 1.1 + 1e-4
