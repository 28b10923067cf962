"""The int8 / fp8 matrix products on the GPU, as Triton kernels (the element-wise quantise
and dequantise kernels are `quantise_kernels`).

* `int8_gemm(a, wt, scale, out)`: `out = (a @ wt.T) * scale[None, :]`, int8 operands, exact
  int32 sums in registers, the dequantise as the epilogue: the int32 product never goes to
  memory (`torch._int_mm` writes it and `dequantise` reads it back: 8 bytes per output element
  more). Tiles autotuned per (M, N, K) on CUDA (`GEMM_CONFIGS`; 128 x 128 x 64, fewer rows
  for small products, where nothing is timed), grouped launch order so neighbouring programs
  share weight tiles in L2.
* `fp8_gemm(a, wt, scale, out)`: the same kernel for fp8 e4m3 operands, float32 sums.
* `_tma_gemm_kernel`: the int8 GEMM with its operand tiles loaded by Hopper's tensor memory
  accelerator (host tensor descriptors), one tile a program or persistent; opt-in
  (`PGX_GPU_INT8_TMA`=1 or `auto`). Triton makes a wgmma asynchronous only with float32 sums
  (its WGMMA pipeliner, rule 2.1), so int8 MMAs are waited for one by one with either kernel.
  H200, graph-replayed, 4096 rows (`benchmarks/bertgpu_probe.py`): TMA against pointer
  kernel 21.9 / 25.8 us (N 3072, K 768, no epilogue), 18.5 / 22.7 (N 768, K 3072, bias),
  25.1 / 24.4 (N 2304, K 768), 52.4 / 48.2 (N 3072 with bias, GELU and int8 quantise: the
  GELU's erf makes that epilogue ~24 us of ALU work, libdevice's two coefficient sets chosen
  per element); in the BERT program with the per-shape timed choice the int8 run was not
  faster (a call where the program's N 768 product took 29.8 us against 26.2), hence opt-in.
* the int8 / fp8 convolution kernel (`quant_conv_kernels.py`) shares `_tile` and
  `_store_dequantised` (the epilogue, which also quantises to int8 or fp8: its division by the
  scale is `quantise.quotient`, bit for bit `div_rn` without a branch per element; on an H200 the
  per-element `div_rn` made a quantising epilogue cost more than the product: ResNet-50 b32
  int8 2.09 ms with it against fp16 1.40 in one call, 1.42 without against fp16 1.47 in
  another).

They take 2-D views with unit inner stride (the caller flattens); on a machine without a GPU
they run under `TRITON_INTERPRET=1` on CPU tensors, and `eager_*` give the same numbers with
torch ops where Triton is off.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch
import triton
import triton.language as tl
import triton.testing

from pygraphx.codegen.triton.quantise import (
    MAGIC,
    fp8_of_quotient,
    int8_of_quotient,
    quotient,
)
from pygraphx.codegen.triton.timing import time_candidates
from pygraphx.targets.gpu.quantise_kernels import capability

log = logging.getLogger(__name__)

#: fp8 operands on CUDA read through fp8 pointers (`_fp8_pointers`); False reads them as bytes
#: as the interpreter does (only for timing the two against each other: same numbers)
FP8_POINTERS = True


@triton.jit
def _tile_offsets(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile number `tile`'s first output row and column (grouped order: neighbouring tiles
    share weight tiles in L2)."""
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group) % size_m
    pid_n = (tile % group) // size_m
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's output rows and columns (grouped order: neighbours share weight tiles)."""
    off_m, off_n = _tile_offsets(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    return off_m + tl.arange(0, BLOCK_M), off_n + tl.arange(0, BLOCK_N)


@triton.jit
def _epilogue_op(
    y, code: tl.constexpr, rows, cols, mask, bias_ptr, res_ptr, stride_rm, N, ty, g1, g2, g3,
    rs_ptr, rb_ptr, r0, PRE: tl.constexpr,
):  # fmt: skip
    """One element-wise op after the dequantise (0 none, 1 + bias[col], 2 + residual[row, col],
    3 relu, 4 GELU `(y * (erf(y * g1) + g2)) * g3`, 5 + the residual's own dequantise and bias
    `(residual * rs[col]) + rb[col]`), rounded to the output type `ty` as the unfused op would
    store it (GELU: once, as a generated group computes it in float32). `PRE`: the residual
    tile is `r0`, loaded before the product (`_residual_tile`), not here."""
    if code == 1:
        b = tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        y = (y + b[None, :]).to(ty).to(tl.float32)
    elif code == 2:
        r = _residual_tile(res_ptr, rows, cols, stride_rm, mask, r0, PRE)
        y = (y + r.to(tl.float32)).to(ty).to(tl.float32)
    elif code == 3:
        y = tl.maximum(y, 0.0)
    elif code == 4:
        y = ((y * (tl.erf(y * g1) + g2)) * g3).to(ty).to(tl.float32)
    elif code == 5:
        r = _residual_tile(res_ptr, rows, cols, stride_rm, mask, r0, PRE)
        rs = tl.load(rs_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        rb = tl.load(rb_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        r = (r.to(tl.float32) * rs[None, :]).to(ty).to(tl.float32)
        r = (r + rb[None, :]).to(ty).to(tl.float32)
        y = (y + r).to(ty).to(tl.float32)
    return y


@triton.jit
def _residual_tile(res_ptr, rows, cols, stride_rm, mask, r0, PRE: tl.constexpr):
    """The residual's (rows, cols) tile: `r0` when it was loaded before the product (`PRE`),
    else loaded now."""
    if PRE:
        r = r0
    else:
        r = tl.load(res_ptr + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0)
    return r


@triton.jit
def _store_dequantised(
    acc, rows, cols, scale_ptr, out_ptr, M, N, stride_om, bias_ptr, res_ptr, stride_rm,
    qs_ptr, q_ptr, stride_qm, g1, g2, g3, rs_ptr, rb_ptr,
    E0: tl.constexpr, E1: tl.constexpr, E2: tl.constexpr,
    QUANT: tl.constexpr, STORE: tl.constexpr, MAGIC: tl.constexpr, CAST: tl.constexpr = False,
    r0=0.0, PRE: tl.constexpr = False, RECIP: tl.constexpr = False,
):  # fmt: skip
    """`acc`'s dequantise, the epilogue ops `E0`-`E2` (`_epilogue_op`; `PRE`: the residual
    tile `r0` already loaded), the float store and / or the quantise (`QUANT`)."""
    ty = out_ptr.dtype.element_ty
    s = tl.load(scale_ptr + cols, mask=cols < N, other=0.0)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    y = (acc.to(tl.float32) * s[None, :]).to(ty).to(tl.float32)
    # each argument spelled out: Triton 3.6 takes no dtype (`ty`) inside a tuple
    y = _epilogue_op(
        y, E0, rows, cols, mask, bias_ptr, res_ptr, stride_rm, N, ty, g1, g2, g3, rs_ptr, rb_ptr,
        r0, PRE,
    )  # fmt: skip
    y = _epilogue_op(
        y, E1, rows, cols, mask, bias_ptr, res_ptr, stride_rm, N, ty, g1, g2, g3, rs_ptr, rb_ptr,
        r0, PRE,
    )  # fmt: skip
    y = _epilogue_op(
        y, E2, rows, cols, mask, bias_ptr, res_ptr, stride_rm, N, ty, g1, g2, g3, rs_ptr, rb_ptr,
        r0, PRE,
    )  # fmt: skip
    if STORE:
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], y.to(ty), mask=mask)
    if QUANT != 0:  # the quantise of the stored value: `quantise_int8`'s / `quantise_fp8`'s
        # y is already a value of the output type (the dequantise and every op but ReLU,
        # which keeps it so, round to it): no second rounding before the quantise
        qs = tl.load(qs_ptr).to(tl.float32)
        if RECIP:  # the product by the reciprocal (`conv`'s `recip`: not div_rn's quotient)
            v = y * tl.math.div_rn(1.0, qs)
        else:
            v = quotient(y, qs, tl.math.div_rn(1.0, qs))
        if QUANT == 1:
            q = int8_of_quotient(v, y, MAGIC)
        else:  # fp8 e4m3fn, its bytes
            q = fp8_of_quotient(v, y, qs, MAGIC, CAST)  # CAST: the hardware conversion
        tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q, mask=mask)


@triton.jit
def _dot8(a, w, acc, FP8: tl.constexpr, NATIVE: tl.constexpr):
    """`acc + a @ w` for int8 tiles (exact int32 sums) or, `FP8`, fp8 e4m3 tiles (on CUDA loaded
    through fp8 pointers, `_fp8_pointers`: the bitcast here is then a no-op) or their bytes
    (uint8, bitcast here: the interpreter cannot fill masked fp8 loads), whose exact
    products are summed in float32, promoted every 32 products (Hopper's fp8 MMA alone keeps
    fewer bits, Triton's default there: the H200 fp8 GEMM test failed with it).

    One `return` after an `if`/`else`: Triton's compiler (unlike the interpreter) goes on past
    a `return` inside a constexpr `if`, so an early fp8 return followed by the int8 `tl.dot`
    compiled that int8 dot with fp8 operands and the float32 `acc` (an assertion in `tl.dot`,
    every fp8 kernel on the H200).

    `NATIVE` (fp8): one `tl.dot` per K block with the tensor cores' own accumulation, no
    promotion (Hopper: fewer bits than float32 within a K block, see `quant_conv_kernels`),
    which keeps the wgmma asynchronous; the interpreter sums in float32 either way."""
    if FP8 and NATIVE:
        a8, w8 = a.to(tl.float8e4nv, bitcast=True), w.to(tl.float8e4nv, bitcast=True)
        acc = tl.dot(a8, w8, acc, out_dtype=tl.float32)
    elif FP8:
        a8, w8 = a.to(tl.float8e4nv, bitcast=True), w.to(tl.float8e4nv, bitcast=True)
        acc = tl.dot(a8, w8, acc, out_dtype=tl.float32, max_num_imprecise_acc=32)
    else:
        acc = tl.dot(a, w, acc, out_dtype=tl.int32)
    return acc


@triton.jit
def _fp8_pointers(a_ptr, w_ptr):
    """`a_ptr`, `w_ptr` (fp8 e4m3 given as bytes) as fp8 pointers. The tiles loaded through them
    feed Hopper's wgmma from shared memory, and the MMA of one K block runs while the next is
    issued; tiles loaded as bytes and bitcast to fp8 in registers go back through shared memory
    each K block and every MMA is waited for at once (Triton 3.6 TTGIR on sm_90:
    `benchmarks/quant_wgmma_probe.py`). Masked loads must give `other=0.0` (an int 0 does not
    cast to fp8). The interpreter cannot fill masked fp8 loads: it reads the bytes."""
    fp8 = tl.pointer_type(tl.float8e4nv)
    return a_ptr.to(fp8, bitcast=True), w_ptr.to(fp8, bitcast=True)


@triton.jit
def _zero_sums(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr):
    """A tile's zero sums: float32 for fp8 products, else int32 for int8 ones."""
    if FP8:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    return acc


@triton.jit
def _int8_gemm_kernel(
    a_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, stride_am, stride_wn, stride_om,
    bias_ptr, res_ptr, stride_rm, qs_ptr, q_ptr, stride_qm, g1, g2, g3, rs_ptr, rb_ptr,
    E0: tl.constexpr, E1: tl.constexpr, E2: tl.constexpr,
    QUANT: tl.constexpr, STORE: tl.constexpr, MAGIC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FP8: tl.constexpr = False, FP8_PTRS: tl.constexpr = False,
):  # fmt: skip
    if FP8_PTRS:
        a_ptr, w_ptr = _fp8_pointers(a_ptr, w_ptr)
    rows, cols = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    ks = tl.arange(0, BLOCK_K)
    acc = _zero_sums(BLOCK_M, BLOCK_N, FP8)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        a = tl.load(
            a_ptr + rows[:, None] * stride_am + kk[None, :],
            mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0,
        )  # fmt: skip
        w = tl.load(
            w_ptr + cols[None, :] * stride_wn + kk[:, None],
            mask=(cols[None, :] < N) & (kk[:, None] < K), other=0.0,
        )  # fmt: skip
        acc = _dot8(a, w, acc, FP8, False)
    _store_dequantised(
        acc, rows, cols, scale_ptr, out_ptr, M, N, stride_om, bias_ptr, res_ptr, stride_rm,
        qs_ptr, q_ptr, stride_qm, g1, g2, g3, rs_ptr, rb_ptr, E0, E1, E2, QUANT, STORE, MAGIC,
    )  # fmt: skip


@triton.jit
def _tma_gemm_kernel(
    a_desc, w_desc, scale_ptr, out_ptr, M, N, K, stride_om,
    bias_ptr, res_ptr, stride_rm, qs_ptr, q_ptr, stride_qm, g1, g2, g3, rs_ptr, rb_ptr,
    E0: tl.constexpr, E1: tl.constexpr, E2: tl.constexpr,
    QUANT: tl.constexpr, STORE: tl.constexpr, MAGIC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FP8: tl.constexpr = False, PERSISTENT: tl.constexpr = False,
):  # fmt: skip
    """`_int8_gemm_kernel` with its operand tiles loaded by Hopper's tensor memory accelerator
    (`a_desc`, `w_desc`: host tensor descriptors of `a` (M, K) and `wt` (N, K), blocks
    [BLOCK_M, BLOCK_K] and [BLOCK_N, BLOCK_K], zero filled beyond the edges): the tiles land
    in shared memory in the layout the wgmma reads, no address arithmetic or masks per
    element. `PERSISTENT`: the grid is at most the SM count and each program walks the
    output tiles a grid apart."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    if PERSISTENT:
        step = tl.num_programs(0)
    else:
        step = tiles
    for tile in tl.range(tl.program_id(0), tiles, step, flatten=PERSISTENT):
        off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = _zero_sums(BLOCK_M, BLOCK_N, FP8)
        for k0 in range(0, K, BLOCK_K):
            a = a_desc.load([off_m, k0])
            w = w_desc.load([off_n, k0])
            acc = _dot8(a, w.T, acc, FP8, False)
        rows, cols = off_m + tl.arange(0, BLOCK_M), off_n + tl.arange(0, BLOCK_N)
        _store_dequantised(
            acc, rows, cols, scale_ptr, out_ptr, M, N, stride_om, bias_ptr, res_ptr, stride_rm,
            qs_ptr, q_ptr, stride_qm, g1, g2, g3, rs_ptr, rb_ptr, E0, E1, E2, QUANT, STORE,
            MAGIC,
        )  # fmt: skip


def _config(m: int) -> dict[str, int]:
    """The one configuration used where nothing is timed (the interpreter, CPU tensors)."""
    block_m = 128 if m > 64 else max(16, triton.next_power_of_2(m))
    return {"BLOCK_M": block_m, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}


def _grid(m: int, n: int, config: dict[str, int]) -> tuple[int]:
    return (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"]),)


def _tuned_grid(meta: dict[str, Any]) -> tuple[int]:
    return _grid(meta["M"], meta["N"], meta)


#: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): the shapes int8 Triton GEMMs are commonly tuned
#: over (tiles of 64-256, int8 K blocks of 64-128 bytes, 3-5 stages within shared memory)
GEMM_CONFIGS = [
    (128, 256, 128, 8, 3), (256, 128, 128, 8, 3), (128, 128, 128, 8, 4), (128, 128, 64, 4, 4),
    (64, 128, 128, 4, 4), (128, 64, 128, 4, 4), (64, 64, 128, 4, 5), (128, 128, 64, 8, 5),
]  # fmt: skip


def _autotuned(kernel, configs: list[tuple[int, ...]], key=("M", "N", "K"), prune=None):
    """`kernel` under `triton.autotune` over `configs`, keyed on `key` (M, N, K): each new
    product shape times every configuration (that `prune`, Triton's early_config_prune, keeps)
    at its first launch (the gpu executable's warm-up runs, before the CUDA graph capture) and
    keeps the fastest."""
    return triton.autotune(
        configs=[
            triton.Config(
                {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                num_warps=warps,
                num_stages=stages,
            )
            for bm, bn, bk, warps, stages in configs
        ],
        key=list(key),
        prune_configs_by=None if prune is None else {"early_config_prune": prune},
        do_bench=_quick_bench,
    )(kernel)


def _quick_bench(kernel_call, quantiles):
    """Triton's timing with a short warm-up and 20 ms of repeats (its default 25 + 100 ms per
    configuration and shape adds most of a minute to a ResNet-50 compile)."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)


def _device_bench(kernel_call, quantiles=None):
    """Device time of `kernel_call` with no host time in it (`codegen/triton/timing.py`: the
    launches queued behind a spin kernel, back to back, as a CUDA graph replays them), for
    the TMA kernel's autotune and the `auto` choice. Triton's `do_bench` (`_quick_bench`)
    timed the TMA configurations on an H200 at 36-55 us for BERT's products whose
    graph-replayed times were 18-25 us (`benchmarks/results/h200_bertgpu_probe_d50e28d.json`:
    its launch converts the host descriptors each call), so its choice there is noise."""
    ms = time_candidates([kernel_call], reps=5, rounds=3)[0]
    return ms if quantiles is None else [ms] * len(quantiles)


_tuned: dict[str, Any] = {}


def _tuned_kernel(name: str):
    """The autotuned `int8_gemm` / `fp8_gemm` kernel (made at first use)."""
    if name not in _tuned:
        _tuned[name] = _autotuned(_int8_gemm_kernel, GEMM_CONFIGS)  # one each: own timings
    return _tuned[name]


def _timed(t: torch.Tensor) -> bool:
    """Whether launches on `t` are autotuned (a CUDA tensor, not under the interpreter)."""
    return t.device.type == "cuda" and os.environ.get("TRITON_INTERPRET", "") in ("", "0")


class Epilogue:
    """Element-wise ops after a product's dequantise, in order (at most three): `"bias"`
    (+ `bias[col]`), `"residual"` (+ `residual[row, col]`, a 2-D view with unit inner stride),
    `"relu"`, `"gelu"` (`(y * (erf(y * g1) + g2)) * g3` with `gelu` = (g1, g2, g3), the
    constants of the group's own ops: 1/sqrt(2), 1, 1/2 in the group's type),
    `"residual_affine"` (+ `(residual[row, col] * rs[col]) + rb[col]` with `residual_affine` =
    (rs, rb), float32 vectors: another product's dequantise and bias, each step rounded);
    each rounded to the output's type as the unfused op would store it. With `quant_scale`
    (one float32 value) the result is also quantised into `qout`, int8 or fp8 e4m3fn
    (`quantise_int8`'s, `quantise_fp8`'s arithmetic); `store=False` skips writing the float
    result."""

    CODES = {"bias": 1, "residual": 2, "relu": 3, "gelu": 4, "residual_affine": 5}

    def __init__(
        self,
        ops,
        bias: torch.Tensor | None = None,
        quant_scale: torch.Tensor | None = None,
        store: bool = True,
        gelu: tuple[float, float, float] = (0.0, 0.0, 0.0),
        residual_affine: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        if len(ops) > 3 or any(op not in self.CODES for op in ops):
            raise ValueError(f"unsupported epilogue {ops}")
        if ("residual_affine" in ops) != (residual_affine is not None):
            raise ValueError("a residual_affine epilogue needs its (scale, bias), and only it")
        self.ops, self.bias, self.quant_scale, self.store = list(ops), bias, quant_scale, store
        self.codes = [self.CODES[op] for op in ops] + [0] * (3 - len(ops))
        self.gelu = tuple(float(g) for g in gelu)
        self.residual_affine = residual_affine

    def args(self, scale: torch.Tensor, residual, qout) -> tuple:
        """(bias, residual, its row stride, quantise scale, int8 out, its row stride, the
        three GELU constants, the residual's scale and bias)."""
        bias = self.bias if self.bias is not None else scale
        res = residual if residual is not None else scale
        qs = self.quant_scale if self.quant_scale is not None else scale
        q = qout if qout is not None else scale
        rs = residual.stride(0) if residual is not None else 0
        affine = self.residual_affine or (scale, scale)
        qstride = qout.stride(0) if qout is not None else 0
        return (bias, res, rs, qs, q, qstride, *self.gelu, *affine)


NO_EPILOGUE = Epilogue(())


def _epilogue_args(scale, epilogue: Epilogue | None, residual, qout=None) -> tuple[tuple, dict]:
    ep = epilogue or NO_EPILOGUE
    if (ep.quant_scale is None) != (qout is None):
        raise ValueError("an epilogue that quantises needs the int8 output, and only it")
    e0, e1, e2 = ep.codes
    quant = 0 if qout is None else (1 if qout.dtype == torch.int8 else 2)
    if quant == 2:  # fp8: the kernel writes its bytes
        qout = qout.view(torch.uint8)
    flags = {"QUANT": quant, "STORE": ep.store, "MAGIC": MAGIC}
    return ep.args(scale, residual, qout), {"E0": e0, "E1": e1, "E2": e2, **flags}


def int8_gemm(
    a: torch.Tensor,
    wt: torch.Tensor,
    scale: torch.Tensor,
    out: torch.Tensor,
    epilogue: Epilogue | None = None,
    residual: torch.Tensor | None = None,
    qout: torch.Tensor | None = None,
) -> None:
    """`out = epilogue(float32(a @ wt.T) * scale)` for int8 `a` (M, K) and `wt` (N, K), unit
    inner strides, float32 `scale` (N,), any float `out` (M, N). On CUDA the tiles are
    autotuned per (M, N, K) (`GEMM_CONFIGS`)."""
    _gemm("gemm", a, wt, scale, out, epilogue, residual, qout)


def fp8_gemm(a: torch.Tensor, wt: torch.Tensor, *rest, **options) -> None:
    """`int8_gemm` (the same arguments after `a` and `wt`) for fp8 e4m3 `a` and `wt`: the
    products of fp8 values are exact in float32 and accumulate in float32 (tensor cores on
    sm89+), then `* scale` and the epilogue. The kernel takes their bytes and reads them as fp8
    on CUDA (`_fp8_pointers`), as bytes under the interpreter (`_dot8`)."""
    _gemm("fp8_gemm", a.view(torch.uint8), wt.view(torch.uint8), *_gemm_arguments(*rest, **options))


def _gemm_arguments(scale, out, epilogue=None, residual=None, qout=None) -> tuple:
    return scale, out, epilogue, residual, qout


def _gemm(name: str, a, wt, scale, out, epilogue, residual, qout) -> None:
    m, k = a.shape
    n = wt.shape[0]
    if m == 0 or n == 0:
        return
    extra, codes = _epilogue_args(scale, epilogue, residual, qout)
    codes["FP8"] = name == "fp8_gemm"
    if _tma_ready(a, wt, codes["FP8"]) and _tma_wins(a, wt, scale, out, extra, codes):
        _tma_gemm(a, wt, scale, out, extra, codes)
        return
    codes["FP8_PTRS"] = codes["FP8"] and _timed(a) and FP8_POINTERS  # `_fp8_pointers`
    args = (a, wt, scale, out, m, n, k, a.stride(0), wt.stride(0), out.stride(0), *extra)
    if _timed(a):
        _tuned_kernel(name)[_tuned_grid](*args, **codes)
        return
    config = _config(m)
    _int8_gemm_kernel[_grid(m, n, config)](*args, **codes, **config, num_warps=8, num_stages=4)


#: which int8 GEMM kernel runs where the TMA one can (`_tma_ready`): `0` (default) the pointer
#: kernel, `1` the TMA kernel, `auto` both autotuned and timed at a product's first launch
#: (per shape and epilogue), the faster kept. Same numbers either way (exact int32 sums, one
#: epilogue code). Off by default: on an H200 the TMA kernel was faster alone for some of
#: BERT-base's products (`benchmarks/bertgpu_probe.py`) but the program was not (module doc)
INT8_TMA_ENV = "PGX_GPU_INT8_TMA"
#: overrides `PGX_GPU_INT8_TMA` when set ("0", "1" or "auto"; for A/B timing in one process)
TMA_GEMM: str | None = None
_tma_choice: dict[tuple, bool] = {}
#: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, persistent) the TMA GEMM is autotuned over.
#: Triton makes a wgmma asynchronous only with float32 sums (its WGMMA pipeliner's rule 2.1),
#: so each int8 MMA is waited for at once: the tensor cores stay busy only with several warp
#: groups an SM (8 warps, or tiles small enough in shared memory for two or three programs)
TMA_CONFIGS = [
    (128, 128, 128, 8, 3, False), (128, 128, 64, 4, 4, False), (128, 256, 128, 8, 3, False),
    (256, 128, 128, 8, 3, False), (128, 64, 128, 4, 4, False), (64, 128, 128, 4, 4, False),
    (128, 128, 128, 8, 3, True), (128, 128, 64, 4, 4, True),
]  # fmt: skip
#: programs an SM that a persistent TMA launch starts
PERSISTENT_PER_SM = 2


def _tma_mode() -> str:
    """`TMA_GEMM`, else `PGX_GPU_INT8_TMA` (unset: "0")."""
    mode = TMA_GEMM if TMA_GEMM is not None else os.environ.get(INT8_TMA_ENV, "").strip() or "0"
    if mode not in ("0", "1", "auto"):
        raise ValueError(f"{INT8_TMA_ENV}={mode!r}: expected 0, 1 or auto")
    return mode


def _tma_ready(a: torch.Tensor, wt: torch.Tensor, fp8: bool) -> bool:
    """Whether the TMA kernel may take this product: `PGX_GPU_INT8_TMA` not 0, int8 operands,
    a CUDA device of compute capability 9 or later (not the interpreter), 16-byte aligned
    bases and rows."""
    if _tma_mode() == "0" or fp8 or not _timed(a):
        return False
    index = torch.cuda.current_device() if a.device.index is None else a.device.index
    if capability(index) < (9, 0):
        return False
    return all(t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0 for t in (a, wt))


def _tma_blocks(nargs: dict[str, Any]) -> None:
    """The autotuner's pre-launch hook: the descriptors' block shapes for this configuration."""
    nargs["a_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    nargs["w_desc"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_K"]]


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _tma_kernel():
    """The autotuned `_tma_gemm_kernel` (made at first use)."""
    if "tma" not in _tuned:
        configs = [
            triton.Config(
                {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "PERSISTENT": p},
                num_warps=warps,
                num_stages=stages,
                pre_hook=_tma_blocks,
            )
            for bm, bn, bk, warps, stages, p in TMA_CONFIGS
        ]
        tune = triton.autotune(configs=configs, key=["M", "N", "K"], do_bench=_device_bench)
        _tuned["tma"] = tune(_tma_gemm_kernel)
    return _tuned["tma"]


def _tma_wins(a, wt, scale, out, extra: tuple, codes: dict) -> bool:
    """Whether this product runs the TMA kernel: `PGX_GPU_INT8_TMA=1`, or `auto` and at its
    first launch (the executable's warm-up, before the CUDA graph capture) the autotuned TMA
    kernel timed faster than the autotuned pointer one (kept per shape and epilogue, logged)."""
    if _tma_mode() == "1":
        return True
    m, k = a.shape
    key = (m, wt.shape[0], k, a.dtype, out.dtype, tuple(sorted(codes.items())))
    if key not in _tma_choice:
        args = (a, wt, scale, out, m, wt.shape[0], k, a.stride(0), wt.stride(0), out.stride(0))
        ptr = functools.partial(_tuned_kernel("gemm")[_tuned_grid], *args, *extra, **codes)
        tma = functools.partial(_tma_gemm, a, wt, scale, out, extra, codes)
        ptr(), tma()  # each autotunes at its first call
        times = time_candidates([ptr, tma])
        _tma_choice[key] = times[1] < times[0]
        log.info("int8 GEMM %s: pointer %.4f ms, TMA %.4f ms", key[:3], *times)
    return _tma_choice[key]


def _tma_gemm(a, wt, scale, out, extra: tuple, codes: dict) -> None:
    """`_gemm` by the TMA kernel (`_tma_ready`)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = a.shape
    n = wt.shape[0]
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [16, 16])  # blocks: `_tma_blocks`
    w_desc = TensorDescriptor(wt, [n, k], [wt.stride(0), 1], [16, 16])
    sms = _sm_count(a.device.index if a.device.index is not None else torch.cuda.current_device())

    def grid(meta: dict[str, Any]) -> tuple[int]:
        tiles = _grid(m, n, meta)[0]
        return (min(tiles, sms * PERSISTENT_PER_SM) if meta["PERSISTENT"] else tiles,)

    args = (a_desc, w_desc, scale, out, m, n, k, out.stride(0), *extra)
    _tma_kernel()[grid](*args, **codes)


__all__ = [
    "INT8_TMA_ENV",
    "Epilogue",
    "fp8_gemm",
    "int8_gemm",
]
