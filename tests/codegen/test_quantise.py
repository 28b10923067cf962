"""`codegen/triton/quantise.py`'s int8 codes (`int8_code`, a division an element, and
`int8_code_rows`, one reciprocal and fma corrections) against numpy's float32 division, bit for
bit: values at and next to every rounding tie (x / scale = k + 1/2), saturation, NaN and
infinities, over scales of every kind (ordinary, tiny, huge, subnormal, zero, negative,
infinite, NaN). On a GPU the kernel is compiled for it; elsewhere Triton's interpreter runs it
(tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from pygraphx.codegen.triton.kernels import MAGIC  # noqa: E402
from pygraphx.codegen.triton.quantise import int8_code, int8_code_rows  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RNG = np.random.default_rng(5)
BLOCK = 1024


@triton.jit
def _codes(
    x_ptr, scale_ptr, out_ptr, n, BLOCK: tl.constexpr, MAGIC: tl.constexpr, ROWS: tl.constexpr
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if ROWS:
        q = int8_code_rows(x, tl.load(scale_ptr), MAGIC)
    else:
        q = int8_code(x, tl.load(scale_ptr), MAGIC)
    tl.store(out_ptr + offs, q, mask=mask)


def _values(scale: np.float32) -> np.ndarray:
    """Ties k + 1/2 of the quotient for k in [-130, 130] and the 3 floats either side of each
    (scaled as float32 products), random values over the range, and special values."""
    with np.errstate(all="ignore"):
        ties = (np.arange(-130, 131, dtype=np.float32) + np.float32(0.5)) * scale
        near = [ties]
        up, down = ties.copy(), ties.copy()
        for _ in range(3):
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
            near += [up, down]
        spread = RNG.standard_normal(2000).astype(np.float32) * np.float32(60) * scale
    specials = np.array(
        [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e38, -1e38, 3e38, 1e-45, -1e-45, 1.0, -1.0],
        np.float32,
    )
    return np.concatenate([*near, spread, specials]).astype(np.float32)


def _want(x: np.ndarray, scale: np.float32) -> np.ndarray:
    """`ops/quant.py`'s int8 quantise: x / scale in float32, rounded half to even, saturated,
    NaN to -128."""
    with np.errstate(all="ignore"):
        v = x / scale
        r = np.clip(np.rint(np.nan_to_num(v, nan=0.0, posinf=200.0, neginf=-200.0)), -128, 127)
    return np.where(np.isnan(v), -128, r).astype(np.int8)


SCALES = [0.75, 0.013, 1 / 3, 0.1, 1.0, 0.5, 7.0, 1.37 * 2.0**-20, 3.3e-30, 2.0**-126, 1e-40,
          7e29, 1.5 * 2.0**127, 2.0**126, -0.37, 0.0, -0.0, np.inf, np.nan]  # fmt: skip


@pytest.mark.parametrize("rows", [False, True], ids=["int8_code", "int8_code_rows"])
@pytest.mark.parametrize("scale", SCALES + list(RNG.uniform(1e-4, 10.0, 6)))
def test_int8_code_matches_float32_division(scale: float, rows: bool) -> None:
    s = np.float32(scale)
    x = _values(s)
    xt = torch.from_numpy(x).to(DEVICE)
    out = torch.empty(x.shape, dtype=torch.int8, device=DEVICE)
    st = torch.tensor([s], dtype=torch.float32, device=DEVICE)
    grid = (triton.cdiv(x.size, BLOCK),)
    _codes[grid](xt, st, out, x.size, BLOCK=BLOCK, MAGIC=MAGIC, ROWS=rows)
    got, want = out.cpu().numpy(), _want(x, s)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(x[i], got[i], want[i]) for i in bad[:10]]
