"""The native layer norm's v2 rows (`layernorm.c`'s `ln_f32_v2`: the horizontal sums in vector
registers, helper norms18) against float64 torch: odd widths (tails below 16 and 64), strided
rows, with and without the affine parts and the bf16 copy, 1 and 2 threads; the switch
`PGX_CPU_LAYERNORM_V2=0` binds the first rows (`ln_f32`)."""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.torch_lowering import native_layernorm  # noqa: E402

GEN = torch.Generator().manual_seed(1818)


def _lib():
    try:
        return native_layernorm.library()
    except native.NativeUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 15), (5, 17), (37, 45), (9, 63), (7, 65),
                                    (128, 768), (33, 383), (1024, 384)])  # fmt: skip
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("affine", [True, False])
def test_v2_rows_against_float64(rows, n, threads, affine) -> None:
    lib = _lib()
    pad = 7  # strided rows: each row of x and y inside a wider buffer
    x = (torch.randn(rows, n + pad, generator=GEN) * 3 + 100)  # a mean far from 0
    y = torch.full((rows, n + 2 * pad), float("nan"))
    w = torch.randn(n, generator=GEN) if affine else None
    b = torch.randn(n, generator=GEN) if affine else None
    rc = lib.ln_f32_v2(x.data_ptr(), y.data_ptr(), None, None if w is None else w.data_ptr(),
                       None if b is None else b.data_ptr(), rows, n, n + pad, n + 2 * pad, 0,
                       ctypes.c_float(1e-5), threads)  # fmt: skip
    assert rc == 0
    want = torch.nn.functional.layer_norm(
        x[:, :n].double(), (n,), None if w is None else w.double(),
        None if b is None else b.double(), 1e-5)  # fmt: skip
    torch.testing.assert_close(y[:, :n].double(), want, rtol=2e-5, atol=2e-5)
    assert torch.isnan(y[:, n:]).all(), "wrote past the row"


@pytest.mark.parametrize("threads", [1, 2])
def test_v2_bf16_copy(threads) -> None:
    lib = _lib()
    if not lib.ln_bf16_supported():
        pytest.skip("no AVX-512 BF16 in this build")
    rows, n = 19, 77
    x = torch.randn(rows, n, generator=GEN) * 2
    w, b = torch.randn(n, generator=GEN), torch.randn(n, generator=GEN)
    y = torch.empty(rows, n)
    yb = torch.empty(rows, n, dtype=torch.bfloat16)
    assert lib.ln_f32_v2(x.data_ptr(), y.data_ptr(), yb.data_ptr(), w.data_ptr(), b.data_ptr(),
                         rows, n, n, n, n, ctypes.c_float(1e-5), threads) == 0  # fmt: skip
    want = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    torch.testing.assert_close(y.double(), want, rtol=2e-5, atol=2e-5)
    assert torch.equal(yb, y.to(torch.bfloat16))
    only = torch.empty(rows, n, dtype=torch.bfloat16)  # the bf16 result alone
    assert lib.ln_f32_v2(x.data_ptr(), None, only.data_ptr(), w.data_ptr(), b.data_ptr(),
                         rows, n, n, n, n, ctypes.c_float(1e-5), threads) == 0  # fmt: skip
    assert torch.equal(only, yb)


def test_switch_picks_the_entry_point(monkeypatch) -> None:
    lib = _lib()
    norm = native_layernorm.LayerNorm((4, 8), None, None, 1e-5)
    assert norm.fn is lib.ln_f32_v2
    monkeypatch.setenv(native_layernorm.V2_ENV, "0")
    norm = native_layernorm.LayerNorm((4, 8), None, None, 1e-5)
    assert norm.fn is lib.ln_f32
    x = torch.randn(4, 8, generator=GEN)
    torch.testing.assert_close(norm(x), torch.layer_norm(x, (8,), None, None, 1e-5))
