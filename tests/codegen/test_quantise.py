"""`codegen/triton/quantise.py`'s int8 codes (`int8_code`, the quotient from
`normalised_quotient`, and `int8_code_rows`, from `saturating_quotient`) and fp8 e4m3fn bytes
(`fp8_code`, `fp8_code_rows`; built from float32 bits, and on an NVIDIA GPU of sm_89 or later
also by the hardware conversion, `CAST`) against numpy's float32 division (and ml_dtypes'
rounding to e4m3fn), bit for bit: values at and next to every rounding tie
(x / scale = k + 1/2), saturation, NaN and infinities, over scales of every kind (ordinary,
tiny, huge, subnormal, zero, negative, infinite, NaN); `quotient` against `div_rn`. On a GPU
the kernel is compiled for it; elsewhere Triton's interpreter runs it (tests/conftest.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from pygraphx.codegen.triton.kernels import MAGIC  # noqa: E402
from pygraphx.codegen.triton.quantise import (  # noqa: E402
    fp8_code,
    fp8_code_rows,
    int8_code,
    int8_code_rows,
    quotient,
)

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


@triton.jit
def _fp8_codes(
    x_ptr, scale_ptr, out_ptr, n, BLOCK: tl.constexpr, MAGIC: tl.constexpr, ROWS: tl.constexpr,
    CAST: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if ROWS:
        q = fp8_code_rows(x, tl.load(scale_ptr), MAGIC, CAST)
    else:
        q = fp8_code(x, tl.load(scale_ptr), MAGIC, CAST)
    tl.store(out_ptr + offs, q, mask=mask)


def _fp8_values(scale: np.float32) -> np.ndarray:
    """The midpoints between neighbouring e4m3 values of +-[0, 448] (ties of the rounding)
    times the scale and the 2 floats either side of each, random values, saturation, specials."""
    grid = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    grid = np.unique(grid[np.isfinite(grid)])
    with np.errstate(all="ignore"):
        ties = ((grid[:-1] + grid[1:]) / np.float32(2)).astype(np.float32) * scale
        near = [ties]
        up, down = ties.copy(), ties.copy()
        for _ in range(2):
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
            near += [up, down]
        spread = RNG.standard_normal(2000).astype(np.float32) * np.float32(150) * scale
        beyond = np.array([448, 464, 480, 500, 1023, 1024, 1025, 1e6], np.float32) * scale
    return np.concatenate([*near, spread, beyond, -beyond, _values(scale)[-13:]]).astype(np.float32)


def _want_fp8(x: np.ndarray, scale: np.float32) -> np.ndarray:
    """`ops/quant.py`'s fp8 quantise: x / scale in float32, saturated to +-448, rounded half to
    even to e4m3fn (ml_dtypes), NaN kept; as bytes."""
    with np.errstate(all="ignore"):
        v = x / scale
    v = np.where(np.isnan(v), v, np.clip(v, -448.0, 448.0)).astype(np.float32)
    return v.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def _hardware_fp8() -> bool:
    """Whether this run compiles for an NVIDIA GPU with fp8 conversions (`CAST`)."""
    from pygraphx.targets.gpu.quantise_kernels import fp8_cast_supported

    return DEVICE == "cuda" and fp8_cast_supported(torch.device("cuda"))


@pytest.mark.parametrize("cast", [False, True], ids=["bits", "cast"])
@pytest.mark.parametrize("rows", [False, True], ids=["fp8_code", "fp8_code_rows"])
@pytest.mark.parametrize("scale", SCALES + list(RNG.uniform(1e-4, 10.0, 4)))
def test_fp8_code_matches_float32_division(scale: float, rows: bool, cast: bool) -> None:
    _check_fp8_codes(scale, rows, cast, BLOCK)


def _check_fp8_codes(scale: float, rows: bool, cast: bool, block: int, **launch) -> None:
    """`_fp8_codes` over `_fp8_values(scale)` in blocks of `block` equals ml_dtypes' bytes
    (any NaN byte for a NaN)."""
    if cast and not _hardware_fp8():
        pytest.skip("the hardware fp8 conversion needs an NVIDIA GPU of sm_89 or later")
    s = np.float32(scale)
    x = _fp8_values(s)
    xt = torch.from_numpy(x).to(DEVICE)
    out = torch.empty(x.shape, dtype=torch.uint8, device=DEVICE)
    st = torch.tensor([s], dtype=torch.float32, device=DEVICE)
    grid = (triton.cdiv(x.size, block),)
    _fp8_codes[grid](xt, st, out, x.size, BLOCK=block, MAGIC=MAGIC, ROWS=rows, CAST=cast, **launch)
    got, want = out.cpu().numpy(), _want_fp8(x, s)
    nan = np.isnan(want.view(ml_dtypes.float8_e4m3fn).astype(np.float32))
    bad = np.flatnonzero((got != want) & ~(nan & (got & 0x7F == 0x7F)))
    assert bad.size == 0, [(x[i], hex(got[i]), hex(want[i])) for i in bad[:10]]


@pytest.mark.parametrize("rows", [False, True], ids=["fp8_code", "fp8_code_rows"])
@pytest.mark.parametrize("block", [32, 64, 128], ids=["32", "64", "128"])
@pytest.mark.parametrize("scale", [1.0, 0.0093725, 3.7e-3])
def test_fp8_cast_in_narrow_blocks(scale: float, block: int, rows: bool) -> None:
    """The hardware conversion where a block gives each of 4 warps' threads one element or
    fewer (a 64-wide float32 layer-norm row): Triton's pairwise `.to(tl.float8e4nv)` wrote
    one element of a pair twice there on an H100; `e4m3_byte` converts one at a time."""
    _check_fp8_codes(scale, rows, True, block, num_warps=4)


@pytest.fixture(scope="module")
def quotient_kernel():
    @triton.jit
    def kernel(x_ptr, s_ptr, got_ptr, want_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=1.0)
        s = tl.load(s_ptr)
        tl.store(got_ptr + offs, quotient(x, s, tl.math.div_rn(1.0, s)), mask=offs < n)
        tl.store(want_ptr + offs, tl.math.div_rn(x, s), mask=offs < n)

    return kernel


@pytest.mark.parametrize("s", [0.1, 1 / 3, 0.0078125, 3.7e-3, 0.4271, 1.9e-5, 0.999999])
def test_epilogue_quotient_is_div_rn(s: float, quotient_kernel) -> None:
    """The epilogues' branch-free `x / s` (`quantise.quotient`) is bit for bit
    `div_rn` (the standalone quantise kernels' division) on random floats of every size and
    sign, on values within a few ulps of the half-integers and fp8 midpoints where rounding
    decides, on zeros (their sign kept), infinities and NaN."""
    rng = np.random.default_rng(11)
    s32 = np.float32(s)
    mags = np.exp2(rng.uniform(-40, 40, 20000)).astype(np.float32)
    ties = ((np.arange(-300, 300) + 0.5) * s32).astype(np.float32)
    mids = np.array([1.0625, 2.125, 3.25, 13.0, 100.0, 416.0, 0.0146484375]) * s32
    near = np.concatenate([ties, mids.astype(np.float32), -mids.astype(np.float32)])
    steps = np.arange(-4, 5, dtype=np.int32)
    near = (near.view(np.int32)[:, None] + steps[None, :]).reshape(-1).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 6e-8], np.float32)
    x = np.concatenate([mags * rng.choice([-1, 1], mags.size), near, special]).astype(np.float32)
    xt = torch.from_numpy(x).to(DEVICE)
    got, want = torch.empty_like(xt), torch.empty_like(xt)
    st = torch.tensor([s32], device=DEVICE)
    quotient_kernel[(-(-x.size // 1024),)](xt, st, got, want, x.size, BLOCK=1024)
    g, w = got.cpu().numpy(), want.cpu().numpy()
    both_nan = np.isnan(g) & np.isnan(w)
    same = (g.view(np.int32) == w.view(np.int32)) | both_nan
    assert same.all(), (x[~same][:5], g[~same][:5], w[~same][:5])
    assert np.array_equal(w[:-7], (x[:-7] / s32).astype(np.float32), equal_nan=True)


def test_quantising_sources_compile_for_sm90_with_the_fp8_cast(tmp_path) -> None:
    """Generated kernels writing fp8 codes by the hardware conversion (`QuantOutput.cast`)
    and int8 codes (`normalised_quotient`) go through Triton's real compiler to CUDA sm_90
    binaries (the interpreter cannot run the cast: `test_fp8_code_matches_float32_division`
    checks its bytes on such a GPU)."""
    from pygraphx.codegen.triton.emitter import tl_dtype
    from pygraphx.codegen.triton.kernels import QuantOutput, kernel_source
    from tests.codegen.aot_compile import run_jobs
    from tests.codegen.test_triton_kernels import _gelu_tanh_group, _short, scaled_reduce

    row = scaled_reduce("softmax", [8, 768], "half_type", axis=1)[1]
    cases = [(_gelu_tanh_group(), "fp8", True), (row, "fp8", True), (row, "int8", False)]
    jobs = []
    for k, (group, code, cast) in enumerate(cases):
        src = kernel_source(group, QuantOutput(code, store=False, cast=cast))
        assert ("CAST=True" in src.source) == cast
        path = tmp_path / f"q{k}.py"
        path.write_text(src.source)
        sig = {f"in{j}": "*" + _short(tl_dtype(d.dtype)) for j, d in enumerate(group.inputs)}
        sig["out"] = "*" + _short(tl_dtype(group.output.dtype))
        sig |= {"qscale": "*fp32", "qout": "*u8" if code == "fp8" else "*i8", "BLOCK": "constexpr"}
        block = 1 if src.kind == "row" else 1024
        jobs.append(
            {"path": str(path), "signature": sig, "block": block, "targets": [["cuda", 90, 32]]}
        )
    assert len(run_jobs(jobs, tmp_path)) == len(jobs)
