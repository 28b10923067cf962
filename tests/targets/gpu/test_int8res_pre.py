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
    result equals torch's float64 sums scaled and put through the same ops in float32, each
    rounded to half as the unfused ops store them (fp8: within the float32 sums' error, on a GPU the
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

    def half(t: torch.Tensor) -> torch.Tensor:  # a float32 op's result stored as half
        return t.half().float()

    y = half(sums.float() * scale)  # int8 sums below 2**24: exact in float32
    y = half(y + bias.float())
    r = residual.float()
    if affine:
        r = half(half(r * rs) + rb)
    y = half(y + r).clamp(min=0).double()
    out, q = results[1]
    if dtype == F8:  # float32 (interpreter) or the tensor cores' (GPU) sums of fp8 products
        sizes = (sums.abs() * scale.double()).max().item()
        bound = qck.FP8_SUM_ERROR * sizes if DEVICE == "cuda" else 1e-4 * sizes
        np.testing.assert_allclose(out.double().numpy(), y.numpy(), rtol=2e-3, atol=bound)
    else:
        np.testing.assert_array_equal(out.double().numpy(), y.numpy())
    want = torch.round(out.float() / qs).clamp(-128, 127).to(torch.int8)
    np.testing.assert_array_equal(q.numpy(), want.numpy())


def test_tile_launch_loads_the_residual_first_only_where_there_is_one() -> None:
    """A table tile with `PRE` launches `PRE_RES` only for an epilogue reading a residual
    (`residual` or `residual_affine`); a five-entry tile never does."""
    pre_tile, plain = (64, 128, 64, 4, 2, conv_tiles.PRE), (64, 128, 64, 4, 2)
    for ops, reads in ((["bias", "residual", "relu"], True), (["bias", "relu"], False),
                       (["residual_affine"], True), ([], False)):  # fmt: skip
        affine = (torch.ones(1), torch.ones(1)) if "residual_affine" in ops else None
        ep = qk.Epilogue(ops, residual_affine=affine)
        codes = dict(zip(("E0", "E1", "E2"), ep.codes, strict=True))
        config, warps, stages = qck.tile_launch(pre_tile, codes)
        assert config["PRE_RES"] is reads, ops
        assert (config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], warps, stages) == plain
        assert qck.tile_launch(plain, codes)[0]["PRE_RES"] is False


def test_h100_tables_answer_on_an_h100_only() -> None:
    """On an H100 `H100_TABLE` answers int8 kernels and `H100_FP8_TABLE` fp8 ones before the
    other tables; on another Hopper device (an H200) neither does: `TABLE`, for fp8
    `FP8_TABLE` first, as before."""
    shapes = set(conv_tiles.H100_TABLE) | set(conv_tiles.H100_FP8_TABLE)
    for shape in shapes:
        int8 = conv_tiles.H100_TABLE.get(shape) or conv_tiles.TABLE.get(shape)
        fp8_default = conv_tiles.FP8_TABLE.get(shape) or conv_tiles.TABLE.get(shape)
        fp8 = conv_tiles.H100_FP8_TABLE.get(shape) or fp8_default
        assert conv_tiles.table_tile(shape, H100, False) == int8
        assert conv_tiles.table_tile(shape, H100, True) == fp8
        assert conv_tiles.table_tile(shape, H200, False) == conv_tiles.TABLE.get(shape)
        assert conv_tiles.table_tile(shape, H200, True) == fp8_default
    assert conv_tiles.table_tile((7, 7, 7, 7), H100, True) is None
    choice = conv_tiles.TileChoice()
    shape = (100352, 256, 64, 64)
    key = conv_tiles.tile_key(False, qck.POINTWISE, *shape)
    assert choice.find(key, shape, H100, True) == conv_tiles.H100_TABLE[shape]
    fp8_key = conv_tiles.tile_key(True, qck.POINTWISE, *shape)
    assert choice.find(fp8_key, shape, H100, True, True) == conv_tiles.H100_FP8_TABLE[shape]


@pytest.mark.parametrize(
    ("shape", "tile"),
    sorted(conv_tiles.H100_TABLE.items()) + sorted(conv_tiles.H100_FP8_TABLE.items()),
)
def test_h100_tiles_are_ones_autotuning_times(shape, tile) -> None:
    """Each H100 tile (its five entries) is among the configurations `_prune` keeps for its
    shape: the tables pick within the autotuning's candidates, they add none."""
    m, n, k, c = shape
    configs = [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                      num_warps=warps, num_stages=stages)
        for bm, bn, bk, warps, stages in qck.CONV_CONFIGS
    ]  # fmt: skip
    kept = {
        (cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"], cfg.num_warps,
         cfg.num_stages)
        for cfg in qck._prune(configs, {"C": c, "N": n, "K": k}, MODE=qck.IMPLICIT)
    }  # fmt: skip
    assert conv_tiles.tile_form(tile)[0] in kept, (shape, sorted(kept))


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
