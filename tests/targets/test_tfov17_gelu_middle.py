"""The erf-GELU pass's middle form (`vmath.h`'s `vm_gelu_erf_middle_ps` / `vm_gelu_erf3_ps`,
`native_gelu.GeluErf` unless `PGX_CPU_GELU_ERF_MIDDLE=0`; helper tfov17): against float64
`x * erfc(-x / sqrt 2) / 2` (the gelu16 bound: relative 1e-6 max(1, x^2 / 4), 20 float32 units
where |y| > 1e-3) on a dense grid of |x| < 4 in whole vectors of it, a dense grid of (-4, 4)
with every vector forced into it (lane 0 = -3), every 3rd float32 of [-4, -1.5], vectors
mixing the three forms, odd sizes at 1 and 2 threads, a trained-like FFN-up distribution; the
switch picks the two-form kernel; the models against ORT with the middle form taken."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pygraphx.targets.torch_lowering import native_gelu  # noqa: E402
from tests.targets.test_gelu16_native_gelu_erf import check, have_kernel  # noqa: E402

pytestmark = pytest.mark.skipif(
    not have_kernel(), reason="needs a C compiler and AVX-512F (the native gelu kernel)"
)


def middle_vectors(x: torch.Tensor) -> float:
    """The share of x's whole 16-vectors the middle form takes."""
    v = x[: x.numel() // 16 * 16].reshape(-1, 16)
    central = ((v > -1.5) & (v < 2)).all(1)
    return float(((v.abs() < 4).all(1) & ~central).double().mean())


def test_middle_form_dense_grid() -> None:
    x = torch.linspace(-4, 4, 3_200_001, dtype=torch.float64).float()[1:-1]
    x = x[: x.numel() // 16 * 16].contiguous()
    assert middle_vectors(x) > 0.5
    check(x, native_gelu.GeluErf()(x.clone()))


def test_middle_form_forced_grid() -> None:
    """A dense grid of (-4, 4) with every vector forced into the middle form (lane 0 = -3, the
    other 15 lanes grid points; review17c: in the plain grid a vector of consecutive values near
    0 takes the central form, so (-1.5, 2) barely reached the middle form)."""
    grid = torch.linspace(-4, 4, 15 * 200_000 + 2, dtype=torch.float64).float()[1:-1]
    v = torch.full((grid.numel() // 15, 16), -3.0)
    v[:, 1:] = grid.view(-1, 15)
    x = v.view(-1).contiguous()
    assert middle_vectors(x) == 1.0
    check(x, native_gelu.GeluErf()(x.clone()))


def test_middle_form_every_third_float_below_minus_1_5() -> None:
    """Every 3rd float32 in (-4, -1.5]: whole vectors of the middle form, none central."""
    a, b = np.float32(-1.5).view(np.int32), np.float32(-4).view(np.int32)
    x = torch.from_numpy(np.arange(a, b, 3).astype(np.int32).view(np.float32).copy())
    x = x[: x.numel() // 16 * 16].contiguous()
    assert middle_vectors(x) > 0.99
    check(x, native_gelu.GeluErf()(x.clone()))


@pytest.mark.parametrize("n", [1, 15, 17, 4097, 3 * 4096 + 5, 128 * 1536])
@pytest.mark.parametrize("threads", [1, 2])
def test_mixed_forms_sizes_and_threads(monkeypatch, n: int, threads: int) -> None:
    """MiniLM-like values (median -0.7, a long negative tail: the three forms side by side)."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 1.2 - 0.7
    x[::37] *= 3.5  # some lanes past |x| = 4: their vectors take the tail form
    x[: min(n, 3)] = torch.tensor([-3.999, 3.999, -0.0])[: min(n, 3)]
    got = native_gelu.GeluErf()(x.clone())
    check(x, got)
    if n >= 4097:
        assert 0.2 < middle_vectors(x) < 0.95


def test_switch_keeps_two_forms(monkeypatch) -> None:
    lib = native_gelu._BOUND.get()
    monkeypatch.setenv(native_gelu.MIDDLE_ENV, "0")
    assert native_gelu.GeluErf().fn is lib.gelu_erf_f32
    monkeypatch.setenv(native_gelu.MIDDLE_ENV, "1")
    assert native_gelu.GeluErf().fn is lib.gelu_erf_middle_f32
    monkeypatch.delenv(native_gelu.MIDDLE_ENV)
    assert native_gelu.GeluErf().fn is lib.gelu_erf_middle_f32
    # the two kernels agree where both forms are exact to the bound: same vectors, both checked
    x = torch.randn(4096 * 3) * 1.5 - 1.0
    a = native_gelu.GeluErf()(x.clone())
    monkeypatch.setenv(native_gelu.MIDDLE_ENV, "0")
    b = native_gelu.GeluErf()(x.clone())
    check(x, a)
    check(x, b)
    assert not torch.equal(a, b)  # the middle form was taken (a different rounding)


@pytest.mark.parametrize("middle", ["1", "0"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("decomposed", [False, True])
def test_ffn_against_ort_with_and_without_the_middle_form(monkeypatch, middle, batch,
                                                         decomposed) -> None:  # fmt: skip
    """gelu16's gelu(x @ w + b) (bias around -1: many values in (-4, -1.5)) against ONNX
    Runtime, float32, the pass taken, with three forms and with two."""
    from pygraphx.targets.torch_lowering import onednn_linear
    from tests.targets import test_gelu16_native_gelu_erf as g16

    if not onednn_linear.available():
        pytest.skip("needs oneDNN's C API library")
    monkeypatch.setenv(native_gelu.MIDDLE_ENV, middle)
    g16.test_model_against_ort(monkeypatch, batch, True, decomposed, False)
