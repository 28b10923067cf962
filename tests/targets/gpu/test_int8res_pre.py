"""The 8-bit convolution kernel with its epilogue's residual loaded before the product
(`PRE_RES`, chosen by `conv_tiles.H100_TABLE`): the same numbers as torch's float64
convolution of the same 8-bit values followed by the epilogue's ops in torch, each rounded to
the output type (on the GPU, or under `TRITON_INTERPRET=1` on CPU); and how a table tile turns
into a launch."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from pygraphx.targets.gpu import conv_tiles  # noqa: E402
from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402
from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F8 = torch.float8_e4m3fn
H100 = "NVIDIA H100 80GB HBM3 | triton 3.6.0"
H200 = "NVIDIA H200 | triton 3.6.0"


def _layer(kernel: int, dtype: torch.dtype):
    """A small channels-last layer: (x, wt, geometry, float64 sums in NHWC rows)."""
    n, c, h, w, c_out = 2, 64, 6, 5, 48
    gen = torch.Generator().manual_seed(7 + kernel)
    if dtype == torch.int8:
        x = torch.randint(-128, 128, (n, c, h, w), dtype=torch.int8, generator=gen)
        weight = torch.randint(
            -128, 128, (c_out, c, kernel, kernel), dtype=torch.int8, generator=gen
        )
    else:
        x = (torch.randn((n, c, h, w), generator=gen) * 8).to(F8)
        weight = (torch.randn((c_out, c, kernel, kernel), generator=gen) * 8).to(F8)
    pad = kernel // 2
    sums = torch.nn.functional.conv2d(x.double(), weight.double(), padding=pad)
    sums = sums.permute(0, 2, 3, 1).reshape(-1, c_out)
    x_cl = x.view(torch.uint8).contiguous(memory_format=torch.channels_last).view(dtype)
    wt = weight.view(torch.uint8).permute(0, 2, 3, 1).reshape(c_out, -1).contiguous().view(dtype)
    geometry = (kernel, (1, 1), (pad, pad), (1, 1), h, w)
    return x_cl.to(DEVICE), wt.to(DEVICE), geometry, sums


def _launch(x, wt, scale, out, geometry, ep, residual, qout, pre: bool) -> None:
    """`_conv_kernel` at one small tile, the residual loaded first or not."""
    args, codes = qck.launch_arguments(x, wt, scale, out, geometry, ep, residual, qout)
    config, warps, stages = qck.tile_launch((32, 64, 64, 4, 2, conv_tiles.PRE), codes)
    assert config["PRE_RES"] is True
    config["PRE_RES"] = pre
    grid = qk._grid(out.shape[0], out.shape[1], config)
    qck._conv_kernel[grid](*args, **codes, **config, num_warps=warps, num_stages=stages)


@pytest.mark.parametrize("dtype", [torch.int8, F8], ids=["int8", "fp8"])
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("affine", [False, True], ids=["residual", "residual_affine"])
def test_residual_loaded_first_matches_torch(dtype, kernel: int, affine: bool) -> None:
    """bias + residual (or another product's residual with its scale and bias) + ReLU, then
    the int8 quantise, with and without `PRE_RES`: both forms give the same bytes; the float
    result equals torch's float64 sums scaled and put through the same ops, each rounded to
    half as the unfused ops store them (fp8: within the float32 sums' error, on a GPU the
    tensor cores', `qck.FP8_SUM_ERROR`); the quantised bytes equal torch's quantise of the
    kernel's float result."""
    x, wt, geometry, sums = _layer(kernel, dtype)
    m, c_out = sums.shape
    gen = torch.Generator().manual_seed(kernel)
    scale = torch.rand(c_out, generator=gen) * (1e-4 if dtype == torch.int8 else 1e-2)
    bias = torch.randn(c_out, generator=gen).half()
    residual = (torch.randn(m, c_out, generator=gen) * 4).half()
    rs, rb = torch.rand(c_out, generator=gen) + 0.5, torch.randn(c_out, generator=gen)
    ops = ["bias", "residual_affine" if affine else "residual", "relu"]
    qs = torch.tensor([0.05])
    affine_args = (rs.to(DEVICE), rb.to(DEVICE)) if affine else None
    ep = qk.Epilogue(ops, bias.to(DEVICE), qs.to(DEVICE), residual_affine=affine_args)
    results = []
    for pre in (False, True):
        out = torch.empty((m, c_out), dtype=torch.float16, device=DEVICE)
        q = torch.empty((m, c_out), dtype=torch.int8, device=DEVICE)
        _launch(x, wt, scale.to(DEVICE), out, geometry, ep, residual.to(DEVICE), q, pre)
        results.append((out.cpu(), q.cpu()))
    np.testing.assert_array_equal(results[0][0].numpy(), results[1][0].numpy())
    np.testing.assert_array_equal(results[0][1].numpy(), results[1][1].numpy())

    def half(t: torch.Tensor) -> torch.Tensor:
        return t.half().double()

    y = half(sums * scale.double())
    y = half(y + bias.double())
    r = residual.double()
    if affine:
        r = half(half(r * rs.double()) + rb.double())
    y = half(y + r).clamp(min=0)
    out, q = results[1]
    if dtype == F8:  # float32 (interpreter) or the tensor cores' (GPU) sums of fp8 products
        sizes = (sums.abs() * scale.double()).max().item()
        bound = qck.FP8_SUM_ERROR * sizes if DEVICE == "cuda" else 1e-4 * sizes
        np.testing.assert_allclose(out.double().numpy(), y.numpy(), rtol=2e-3, atol=bound)
    else:
        np.testing.assert_array_equal(out.double().numpy(), y.numpy())
    want = torch.round(out.float() / qs).clamp(-128, 127).to(torch.int8)
    np.testing.assert_array_equal(q.numpy(), want.numpy())


def test_residual_first_variants_compile_for_sm90_and_gfx942(tmp_path) -> None:
    """`PRE_RES` launches through Triton's real compiler (`test_gpu_quant_aot`'s jobs): int8
    for sm_90 and gfx942, fp8 for sm_90, a residual and a residual_affine epilogue with the
    quantise, at the H100 table's residual tile; each fits one sm_90 block's shared memory."""
    from tests.targets.gpu.test_gpu_quant_aot import _compile, _product_job

    tile = next(t for t in conv_tiles.H100_TABLE.values() if conv_tiles.tile_form(t)[1])
    five = conv_tiles.tile_form(tile)[0]
    jobs = []
    for fp8, ops, mode in ((False, ("bias", "residual", "relu"), qck.POINTWISE),
                           (False, ("bias", "residual_affine", "relu"), qck.IMPLICIT),
                           (True, ("bias", "residual", "relu"), qck.POINTWISE)):  # fmt: skip
        quant = 2 if fp8 else 1
        job = _product_job(fp8, mode, quant, True, ops, "fp16", five, f"pre-{fp8}-{ops}")
        job["constexprs"]["PRE_RES"] = True
        job["signature"]["PRE_RES"] = "constexpr"
        jobs.append(job)
    _compile(jobs, tmp_path)
