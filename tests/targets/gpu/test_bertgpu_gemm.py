"""The int8 GEMM whose operand tiles come by Hopper's tensor memory accelerator
(`quant_kernels._tma_gemm_kernel`) against numpy: exact int32 sums times the column scale,
with masked edges (TMA zero fill), one tile a program and persistent programs, and BERT's
bias + GELU + int8 quantise epilogue. On a GPU of compute capability 9+ through `int8_gemm`
(autotuned), elsewhere the kernel at one configuration under Triton's interpreter."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
RNG = np.random.default_rng(12)
TMA_GPU = CUDA and torch.cuda.get_device_capability() >= (9, 0)


def _run(a, wt, scale, out, ep=None, qout=None, persistent=False) -> None:
    """`int8_gemm` by the TMA kernel: on a Hopper GPU the library call (checked to take the
    TMA path), else the kernel itself at one configuration (interpreter, CPU tensors)."""
    if TMA_GPU:
        assert qk._tma_ready(a, wt, False)
        qk.int8_gemm(a, wt, scale, out, ep, None, qout)
        return
    if CUDA:
        pytest.skip("the TMA kernel needs compute capability 9.0 or later")
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = a.shape
    n = wt.shape[0]
    cfg = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "PERSISTENT": persistent}
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [32, 32])
    w_desc = TensorDescriptor(wt, [n, k], [wt.stride(0), 1], [32, 32])
    extra, codes = qk._epilogue_args(scale, ep, None, qout)
    tiles = qk._grid(m, n, cfg)[0]
    grid = (min(tiles, 3) if persistent else tiles,)
    qk._tma_gemm_kernel[grid](
        a_desc, w_desc, scale, out, m, n, k, out.stride(0), *extra, **codes, FP8=False, **cfg
    )


def _operands(m: int, k: int, n: int):
    a = RNG.integers(-128, 128, (m, k)).astype(np.int8)
    wt = RNG.integers(-128, 128, (n, k)).astype(np.int8)
    scale = (RNG.random(n) * 2e-4 + 1e-5).astype(np.float32)
    sums = a.astype(np.int64) @ wt.astype(np.int64).T
    return a, wt, scale, sums


@pytest.fixture(autouse=True)
def _force_tma(monkeypatch):
    """On the GPU, `int8_gemm` takes the TMA kernel (not the timed choice)."""
    monkeypatch.setattr(qk, "TMA_GEMM", "1")


@pytest.mark.parametrize("persistent", [False, True], ids=["tiles", "persistent"])
@pytest.mark.parametrize(("m", "k", "n"), [(70, 208, 130), (96, 64, 48)])
def test_tma_gemm_matches_numpy(m: int, k: int, n: int, persistent: bool) -> None:
    a, wt, scale, sums = _operands(m, k, n)
    want = sums.astype(np.float32) * scale[None, :]
    out = torch.empty((m, n), dtype=torch.float32, device=DEVICE)
    tensors = [torch.from_numpy(t).to(DEVICE) for t in (a, wt, scale)]
    _run(*tensors, out, persistent=persistent)
    np.testing.assert_allclose(out.cpu().numpy(), want, rtol=1e-6)


def _gelu_int8(sums: np.ndarray, scale, bias, qs: np.float32) -> np.ndarray:
    """numpy: each op of the unfused half program rounded to half, then the int8 quantise."""
    y = (sums.astype(np.float32) * scale[None, :]).astype(np.float16).astype(np.float32)
    y = (y + bias[None, :]).astype(np.float16).astype(np.float32)
    erf = np.vectorize(math.erf)(y.astype(np.float64) * (1 / math.sqrt(2)))
    g = (y * (erf.astype(np.float32) + 1.0)) * 0.5
    g = g.astype(np.float16).astype(np.float32)
    return np.clip(np.rint(g / qs), -128, 127).astype(np.int8)


def test_tma_gemm_gelu_quantise_epilogue_matches_numpy() -> None:
    """BERT's first feed-forward product: bias, GELU and the int8 quantise of the result
    (the half result not stored). float32 erf may differ from numpy's by an ulp, which can
    move a half value and then an int8 code by one step: at most a few codes, by one."""
    m, k, n = 80, 96, 136
    a, wt, scale, sums = _operands(m, k, n)
    bias = (RNG.standard_normal(n) * 0.5).astype(np.float32)
    qs = np.float32(0.02)
    want = _gelu_int8(sums, scale, bias, qs)
    dev = [torch.from_numpy(t).to(DEVICE) for t in (a, wt, scale, bias)]
    ep = qk.Epilogue(
        ("bias", "gelu"),
        bias=dev[3],
        quant_scale=torch.tensor([qs], device=DEVICE),
        store=False,
        gelu=(1 / math.sqrt(2), 1.0, 0.5),
    )
    out = torch.empty((m, n), dtype=torch.half, device=DEVICE)
    qout = torch.zeros((m, n), dtype=torch.int8, device=DEVICE)
    _run(*dev[:3], out, ep, qout)
    diff = np.abs(qout.cpu().numpy().astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1
    assert np.count_nonzero(diff) <= 0.002 * diff.size, np.count_nonzero(diff)
    assert np.unique(want).size > 100  # the codes span the range: the check has teeth


def test_unaligned_rows_take_the_pointer_kernel() -> None:
    """A row stride that is not a multiple of 16 bytes cannot be a TMA descriptor's."""
    base = torch.zeros((8, 40), dtype=torch.int8, device=DEVICE)
    a = base[:, :20]
    assert not qk._tma_ready(a, base[:, :20], False)


@pytest.mark.skipif(not TMA_GPU, reason="the timed choice needs a GPU of compute capability 9+")
def test_timed_choice_keeps_the_numbers(monkeypatch) -> None:
    """`PGX_GPU_INT8_TMA=auto`: the first launch times both kernels and keeps one per shape;
    the result is numpy's whichever wins."""
    monkeypatch.setattr(qk, "TMA_GEMM", None)
    monkeypatch.setenv(qk.INT8_TMA_ENV, "auto")
    a, wt, scale, sums = _operands(256, 256, 192)
    want = sums.astype(np.float32) * scale[None, :]
    out = torch.empty((256, 192), dtype=torch.float32, device=DEVICE)
    qk.int8_gemm(*[torch.from_numpy(t).to(DEVICE) for t in (a, wt, scale)], out)
    assert any(key[:3] == (256, 192, 256) for key in qk._tma_choice)
    np.testing.assert_allclose(out.cpu().numpy(), want, rtol=1e-6)


def test_unknown_tma_setting_is_an_error(monkeypatch) -> None:
    monkeypatch.setattr(qk, "TMA_GEMM", None)
    monkeypatch.setenv(qk.INT8_TMA_ENV, "yes")
    a = torch.zeros((16, 16), dtype=torch.int8, device=DEVICE)
    with pytest.raises(ValueError, match=qk.INT8_TMA_ENV):
        qk._tma_ready(a, a, False)


def test_tma_is_off_by_default(monkeypatch) -> None:
    monkeypatch.setattr(qk, "TMA_GEMM", None)
    monkeypatch.delenv(qk.INT8_TMA_ENV, raising=False)
    a = torch.zeros((16, 16), dtype=torch.int8, device=DEVICE)
    assert not qk._tma_ready(a, a, False)


def test_tma_kernel_compiles_for_sm90(tmp_path) -> None:
    """The TMA kernel goes through Triton's real compiler to sm_90 (no GPU needed) for the
    autotuned tiles, one tile a program and persistent, with BERT's epilogues (bias + GELU +
    int8 quantise without the half result; bias + residual stored)."""
    from tests.codegen.aot_compile import run_jobs

    fn = qk._tma_gemm_kernel
    jobs = []
    cases = [((1, 4, 0), 1, False), ((1, 2, 0), 0, True)]
    for k, (bm, bn, bk, warps, stages, persistent) in enumerate(qk.TMA_CONFIGS):
        codes, quant, store = cases[k % 2]
        constexprs = {
            "E0": codes[0], "E1": codes[1], "E2": codes[2], "QUANT": quant, "STORE": store,
            "MAGIC": qk.MAGIC, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
            "FP8": False, "PERSISTENT": persistent,
        }  # fmt: skip
        types = {
            "a_desc": f"tensordesc<i8[{bm}, {bk}]>", "w_desc": f"tensordesc<i8[{bn}, {bk}]>",
            "scale_ptr": "*fp32", "out_ptr": "*fp16", "bias_ptr": "*fp32", "res_ptr": "*fp16",
            "qs_ptr": "*fp32", "q_ptr": "*i8" if quant else "*fp32", "rs_ptr": "*fp32",
            "rb_ptr": "*fp32", "g1": "fp32", "g2": "fp32", "g3": "fp32",
        }  # fmt: skip
        sig = {a: "constexpr" if a in constexprs else types.get(a, "i32") for a in fn.arg_names}
        jobs.append(
            {
                "kernel": f"{qk.__name__}:_tma_gemm_kernel",
                "signature": sig,
                "attrs": [a for a in fn.arg_names if sig[a][0] == "*" or a.startswith("stride")],
                "constexprs": constexprs,
                "options": {"num_warps": warps, "num_stages": stages},
                "targets": [["cuda", 90, 32]],
                "name": f"tma{k}",
            }
        )
    assert len(run_jobs(jobs, tmp_path)) == len(jobs)
