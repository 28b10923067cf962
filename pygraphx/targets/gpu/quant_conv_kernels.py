"""The int8 and fp8 e4m3 convolution kernel of the gpu target (Triton, channels-last).

`conv(x, wt, scale, out, geometry, epilogue, residual, qout)` is an implicit GEMM: output row
`(n, ho, wo)`, column `c_out`, `K = kh * kw * C` walked one tap's run of `BLOCK_K` channels at a
time, read in place from the NHWC input (zeros outside it: no patch matrix in memory). The
operands are int8 (exact int32 sums) or fp8 e4m3 (on a GPU Hopper's own fp8 accumulation,
`FP8_NATIVE`: within `FP8_SUM_ERROR` of the exact sum; float32 sums under the interpreter),
multiplied as `quant_kernels._dot8` does; the epilogue is `quant_kernels`': `float32(sum) *
scale[c_out]` in `out`'s type, then up to three of bias / residual / ReLU / GELU / another
product's dequantised residual, then optionally the quantise of the result for the next
convolution (int8 or fp8, one scale) with or without the float store.

How the input tile is read (`input_mode`): a 1x1 stride-1 convolution of a dense NHWC input is
the plain GEMM of its rows (`POINTWISE`); other convolutions with input channels a multiple of
`CONV_BLOCK_K` read one tap's run of channels per K block (`IMPLICIT`, 16-byte aligned rows);
fewer channels, or another layout, gather each element (`GATHER`, any strides, the K tail
masked: no patch matrix either). A convolution of few channels (the 7x7 stem's 3) can instead
read a zero-padded NHWC copy of its input, its channels padded to `row_layout`'s `c4` (`run`
given to `conv`, `ROWS`): one kernel row's window of pixels is then `run` contiguous bytes
(kw * c4, padded to a multiple of `ROWS_BLOCK_K` with zero weights), read like a tap's run of
channels with no per-element decoding or bounds test. The stem took 0.155 ms as GATHER
(ResNet-50 b32 on an H100) against cuDNN half's 0.100: each gathered byte cost its own
address arithmetic and masks. On an H200 (`benchmarks/resgpu_probe.py`,
`benchmarks/results/h200_resgpu_probe.json`) GATHER took 0.364 ms, ROWS 0.083 with the padded
copy (then torch's, 0.022 of it), cuDNN half 0.090.

`RECIP` (`PGX_GPU_QUANTISE=reciprocal`, off by default): the quantising epilogue multiplies by
the scale's reciprocal instead of computing the exact quotient (`quantise.quotient`: a product
and four FMAs an element, then the NaN choice), as TensorRT's int8 kernels do. The 8-bit code
then differs from the exact one (`ref`'s, ONNX's `QuantizeLinear`) by one step where the
quotient lies within about 2**-23 of its magnitude of a rounding boundary (a half-integer for
int8, a midpoint between fp8 values). On an H100 (`benchmarks/int8r_probe.py`, ResNet-50 b32
layers, `benchmarks/results/h100_int8r_probe2.txt`): the 1x1 64 -> 256 expansion at 56x56 with
an int8 residual 40.3 against 48.5 us (cuDNN's fused half: 49.2), the 1x1 256 -> 64 reduce
13.9 against 16.1 (25.6): the epilogue, not the product, is most of these layers' time
(`bare`, the product written in half: 22.8 and 14.5 us). Said once per process on the
`pygraphx.gpu` logger.

`PRE_RES` (an H100 table tile's sixth entry, `conv_tiles.PRE`, `tile_launch`): the epilogue's
residual tile is loaded before the K loop, so its loads overlap the sums instead of following
them (same numbers): on an H100 the int8 1x1 64 -> 256 expansion at 56x56 with its residual
took 56.06 us against 59.38 at the same tile, the 1x1 128 -> 512 at 28x28 31.38 against 32.29
(`benchmarks/results/h100_int8res_probe{,2}.json`; deeper layers gained nothing).

On CUDA each shape's tile comes from `conv_tiles` (this process's choices, an on-disk record,
a table of ResNet-50's shapes on Hopper); a shape found nowhere is autotuned over
`CONV_CONFIGS` at its first launch (the gpu executable's warm-up, before graph capture),
keeping only the K blocks that divide C, and recorded; elsewhere (`TRITON_INTERPRET=1` on CPU
tensors) one configuration runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
import triton
import triton.language as tl

from pygraphx.targets.gpu import conv_tiles
from pygraphx.targets.gpu import quant_kernels as qk
from pygraphx.targets.gpu import quantise_kernels as qe
from pygraphx.targets.settings import env_choice

__all__ = [
    "CONV_BLOCK_K", "CONV_CONFIGS", "FP8_NATIVE", "FP8_SUM_ERROR", "GATHER", "IMPLICIT",
    "POINTWISE", "QUANTISE_ENV", "RESIDUAL_CODES", "ROWS", "ROWS_BLOCK_K", "conv", "input_mode",
    "launch_arguments", "pad_rows", "reciprocal_quantise", "row_layout", "tile_launch",
]  # fmt: skip

log = logging.getLogger("pygraphx.gpu")
#: how the 8-bit quantising epilogues divide by the scale: `exact` (the default, `ref`'s
#: numbers) or `reciprocal` (module docstring: `RECIP`)
QUANTISE_ENV = "PGX_GPU_QUANTISE"
_said: set[str] = set()


def reciprocal_quantise() -> bool:
    """Whether `PGX_GPU_QUANTISE=reciprocal` asks for `RECIP` (said once per process)."""
    recip = env_choice(QUANTISE_ENV, ("exact", "reciprocal"), "exact", lower=True) == "reciprocal"
    if recip and "recip" not in _said:
        _said.add("recip")
        log.warning(
            "gpu: %s=reciprocal: the 8-bit convolutions' quantise multiplies by the scale's "
            "reciprocal, so a code can differ by one step from the exact quotient's near a "
            "rounding boundary (not the ref target's numbers there)", QUANTISE_ENV,
        )  # fmt: skip
    return recip


#: the smallest K block: a convolution read in place needs input channels a multiple of it
CONV_BLOCK_K = 64
#: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): tiles for Hopper's 8-bit tensor cores (K blocks
#: of 64 or 128 bytes; 3-5 stages within shared memory); a K block must divide C. The 64-wide
#: ones are for 64 output channels (ResNet-50's first stage): on an H200 (CUDA graphs) the 3x3
#: layer autotuned took 0.023 ms without them (64 x 64), 0.019 with (128 x 64; cuDNN half 0.025)
#: (`benchmarks/quant_tiles_ab.py`). No 128 x 256 tiles: on an H200 they lost on every layer
#: `benchmarks/quant_conv_probe.py` timed (e.g. 1x1 128 -> 512 at 28x28: 0.0158 ms against
#: 0.0138 for 128 x 128; 3x3 256 at 14x14: 0.0254 against 0.0160), and each tile is a compile
#: and a timing per layer shape at prepare. No 256 x 128 tiles either: the int8 ResNet-50 b32
#: autotuning on an H200 kept them for none of its 25 layer shapes
#: (`benchmarks/results/h200_resgpu_conv_tiles.json`); dropping them saves their compiles.
#: 128 x 64 and 64 x 64 with 128-byte K blocks and 3 stages (2 for one or two K blocks): on
#: an H100 the fastest int8 and fp8 tiles of the 3x3 128-channel layer at 28x28 and the 1x1
#: 512 -> 128 (int8 16.5 against 17.9 us at the tile autotuning kept on an H200), and of the
#: fp8 1x1 256 -> 64 / 128 at 56x56 (`benchmarks/results/h100_fp8conv_probe.json`).
CONV_CONFIGS = [
    (128, 128, 64, 4, 4), (128, 128, 128, 8, 3),
    (64, 128, 128, 4, 4), (128, 64, 128, 4, 4), (64, 64, 64, 4, 5), (64, 128, 64, 4, 5),
    (128, 64, 64, 4, 4), (256, 64, 64, 8, 4), (128, 64, 128, 4, 3), (64, 64, 128, 4, 3),
    # `ROWS` only (K blocks of one kernel row's run of pixels: 32 bytes for the 7x7 stem)
    (128, 64, 32, 4, 4), (256, 64, 32, 8, 4), (128, 128, 32, 8, 4), (64, 64, 32, 4, 4),
]  # fmt: skip
#: the K block of the `ROWS` mode: a kernel row's run is padded to a multiple of it
ROWS_BLOCK_K = 32


#: fp8 sums with Hopper's native fp8 accumulation (`quant_kernels._dot8`'s NATIVE): the
#: wgmma stays asynchronous; False promotes to float32 every 32 products (slower, still not
#: float32-exact on Hopper). On an H200 (Triton 3.6, `benchmarks/quant_conv_probe.py`) the
#: native bare kernels took 0.0126 ms against 0.0191 promoted (1x1 128 -> 512 at 28x28, b32)
#: and 0.0154 against 0.0224 (3x3 256 at 14x14); their sums' error, against float64 sums of
#: the same fp8 values (K = 2304), was at most 3.9e-4 of the sum of the products' magnitudes
#: (mean 1.9e-5; promoted: at most 9.1e-6), far below fp8 e4m3's own rounding (2**-4)
FP8_NATIVE = True
#: the bound the tests hold the GPU's fp8 sums to: |sum - exact| <= FP8_SUM_ERROR * sum |x * w|
#: (ten times the largest error measured on an H200; the interpreter sums in float32)
FP8_SUM_ERROR = 2**-8

#: how `_conv_kernel` reads its input tile (`MODE`)
IMPLICIT, POINTWISE, GATHER, ROWS = 0, 1, 2, 3


@triton.jit
def _input_tile(
    x_ptr, rows, k0, ks, M, K, C, H, W, h0, w0, base, sxh, sxw, sxc, DH, DW, KW,
    MODE: tl.constexpr,
):  # fmt: skip
    """The (BLOCK_M, BLOCK_K) input tile at K offset `k0`: IMPLICIT, one tap's run of channels
    (C % BLOCK_K == 0, dense channels-last: 16-byte aligned rows; ROWS: a kernel row's
    `C` bytes of a padded NHWC copy, 4-byte aligned, never outside it); POINTWISE, the rows of a
    dense NHWC input as they are (1x1, stride 1, no padding); GATHER, each (row, k) decoded to
    its tap and channel (few channels, any strides: the 7x7 stem), the K tail masked."""
    if MODE == 0 or MODE == 3:  # ROWS: a tap is a kernel row, C its run of bytes (KW = 1)
        tap = k0 // C
        kh = tap // KW
        hi, wi = h0 + kh * DH, w0 + (tap - kh * KW) * DW
        inside = (rows < M) & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
        offs = base + hi * sxh + wi * sxw + (k0 - tap * C)
        offs = tl.multiple_of(offs, 16) if MODE == 0 else tl.multiple_of(offs, 4)
        return tl.load(x_ptr + offs[:, None] + ks[None, :], mask=inside[:, None], other=0.0)
    elif MODE == 1:
        offs = tl.multiple_of(rows * sxw + k0, 16)
        return tl.load(x_ptr + offs[:, None] + ks[None, :], mask=(rows < M)[:, None], other=0.0)
    else:
        kk = k0 + ks
        tap = kk // C
        kh = tap // KW
        hi = h0[:, None] + (kh * DH)[None, :]
        wi = w0[:, None] + ((tap - kh * KW) * DW)[None, :]
        inside = (rows < M)[:, None] & (kk < K)[None, :]
        inside = inside & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
        offs = base[:, None] + hi * sxh + wi * sxw + ((kk - tap * C) * sxc)[None, :]
        return tl.load(x_ptr + offs, mask=inside, other=0.0)


@triton.jit
def _conv_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, C, H, W, HO, WO, sxn, sxh, sxw, sxc,
    stride_wn, stride_om, SH, SW, PH, PW, DH, DW, KW,
    bias_ptr, res_ptr, stride_rm, qs_ptr, q_ptr, stride_qm, g1, g2, g3, rs_ptr, rb_ptr,
    E0: tl.constexpr, E1: tl.constexpr, E2: tl.constexpr,
    QUANT: tl.constexpr, STORE: tl.constexpr, MAGIC: tl.constexpr,
    FP8: tl.constexpr, MODE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FP8_PTRS: tl.constexpr = False, FP8_NATIVE: tl.constexpr = False, CAST: tl.constexpr = False,
    PRE_RES: tl.constexpr = False, RECIP: tl.constexpr = False,
):  # fmt: skip
    if FP8_PTRS:  # fp8 bytes read as fp8 (CUDA): `quant_kernels._fp8_pointers`
        x_ptr, w_ptr = qk._fp8_pointers(x_ptr, w_ptr)
    rows, cols = qk._tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    r0 = 0.0
    if PRE_RES:  # the residual's tile read before the product: its loads overlap the sums
        inside = (rows[:, None] < M) & (cols[None, :] < N)
        r0 = tl.load(res_ptr + rows[:, None] * stride_rm + cols[None, :], mask=inside, other=0.0)
    wo = rows % WO
    ho = (rows // WO) % HO
    base = (rows // (WO * HO)) * sxn
    h0, w0 = ho * SH - PH, wo * SW - PW
    ks = tl.arange(0, BLOCK_K)
    acc = qk._zero_sums(BLOCK_M, BLOCK_N, FP8)
    for k0 in range(0, K, BLOCK_K):
        a = _input_tile(
            x_ptr, rows, k0, ks, M, K, C, H, W, h0, w0, base, sxh, sxw, sxc, DH, DW, KW, MODE
        )
        w_at = w_ptr + cols[None, :] * stride_wn + (k0 + ks)[:, None]
        if MODE == 2:  # the K tail
            w = tl.load(w_at, mask=(cols[None, :] < N) & ((k0 + ks) < K)[:, None], other=0.0)
        else:
            w = tl.load(w_at, mask=cols[None, :] < N, other=0.0)
        acc = qk._dot8(a, w, acc, FP8, FP8_NATIVE)  # fp8: fp8 tiles on CUDA, else bytes
    qk._store_dequantised(
        acc, rows, cols, scale_ptr, out_ptr, M, N, stride_om, bias_ptr, res_ptr, stride_rm,
        qs_ptr, q_ptr, stride_qm, g1, g2, g3, rs_ptr, rb_ptr, E0, E1, E2, QUANT, STORE, MAGIC,
        CAST, r0, PRE_RES, RECIP,
    )  # fmt: skip


def _prune(configs: list, named_args: dict, **kwargs) -> list:
    """The configurations whose K block divides the input's channels (one tap per block; `ROWS`:
    the 32-byte K blocks, the others none), `CONV_BLOCK_K` for a gathered input (`MODE`
    GATHER: the K tail is masked); and no column block
    twice as wide as the output channels (64 channels: only the 64-wide tiles); two stages
    where K is one or two blocks (`_shallow`)."""
    c, n, mode = named_args["C"], named_args["N"], kwargs.get("MODE")
    if mode == GATHER:
        kept = [cfg for cfg in configs if cfg.kwargs["BLOCK_K"] == CONV_BLOCK_K]
    else:
        rows = mode == ROWS
        kept = [
            cfg for cfg in configs
            if c % cfg.kwargs["BLOCK_K"] == 0 and (cfg.kwargs["BLOCK_K"] == ROWS_BLOCK_K) == rows
        ] or configs[:1]  # fmt: skip
    kept = [cfg for cfg in kept if cfg.kwargs["BLOCK_N"] < 2 * n] or kept
    k = named_args.get("K")
    return kept if k is None else _shallow(kept, k)


#: a product of at most this many K blocks runs with two pipeline stages
SHALLOW_BLOCKS = 2


def _shallow(configs: list, k: int) -> list:
    """`configs` with at most two stages where K is at most `SHALLOW_BLOCKS` K blocks (a 1x1
    convolution of 64 channels is one block): deeper stages cannot be filled there, and their
    shared memory only limits how many programs an SM runs at once, which is what hides the
    epilogue's loads and stores in such a layer (ResNet-50's 64 -> 256 1x1 layers with their
    residual epilogue took twice their bytes' time on an H200)."""
    out, seen = [], set()
    for cfg in configs:
        kw = cfg.kwargs
        if k <= SHALLOW_BLOCKS * kw["BLOCK_K"] and cfg.num_stages > 2:
            cfg = triton.Config(dict(kw), num_warps=cfg.num_warps, num_stages=2)
        key = (kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], cfg.num_warps, cfg.num_stages)
        if key not in seen:
            seen.add(key)
            out.append(cfg)
    return out


_tuned: dict[str, Any] = {}


def _tuned_kernel():
    """`_conv_kernel` under `triton.autotune` over `CONV_CONFIGS` (made at first use)."""
    if "conv" not in _tuned:
        _tuned["conv"] = qk._autotuned(_conv_kernel, CONV_CONFIGS, ("M", "N", "K", "C"), _prune)
    return _tuned["conv"]


def conv(
    x: torch.Tensor,
    wt: torch.Tensor,
    scale: torch.Tensor,
    out: torch.Tensor,
    geometry: tuple,
    epilogue: qk.Epilogue | None = None,
    residual: torch.Tensor | None = None,
    qout: torch.Tensor | None = None,
    run: int | None = None,
) -> None:
    """`out[(n, ho, wo), c_out] = epilogue(float32(sum x * w) * scale[c_out])` for the int8
    or fp8 e4m3 `x` (N, C, H, W), `wt` (C_out, kh*kw*C) of the same type in (kh, kw, c)
    order (unit inner stride, any row stride), `out` (N*HO*WO, C_out) rows;
    `geometry` = (kw, stride, pads, dilation, HO, WO). Input channels a multiple of
    `CONV_BLOCK_K` in dense channels-last order are read a tap at a time; otherwise (the
    stem's 3 channels, any layout) each element is gathered. `qout` (int8, fp8 e4m3 or its
    bytes as uint8) takes the epilogue's quantised result. With `run` (`ROWS`), `x` is the
    zero-padded copy `row_layout` describes, `wt` its (C_out, kh * run) weights and
    `geometry` = (1, stride, (0, 0), (1, 1), HO, WO)."""
    launch = launch_arguments(x, wt, scale, out, geometry, epilogue, residual, qout, run)
    if launch is None:
        return
    args, codes = launch
    m, c_out = out.shape
    if qk._timed(x):
        r8 = residual is not None and residual.element_size() == 1  # an 8-bit residual
        _tiled_launch(args, codes, x.device, conv_tiles.R8 if r8 else "")
        return
    config = qk._config(m)
    config["BLOCK_K"] = CONV_BLOCK_K if run is None else ROWS_BLOCK_K
    grid = qk._grid(m, c_out, config)
    _conv_kernel[grid](*args, **codes, **config, num_warps=8, num_stages=4)


_tiles = conv_tiles.TileChoice()


def _tiled_launch(args: tuple, codes: dict, device: torch.device, form: str = "") -> None:
    """Launch `_conv_kernel` on CUDA at the shape's tile from `conv_tiles` (this process,
    the on-disk record, the table; `form`: `conv_tiles.R8` for an 8-bit residual), or
    autotuned over `CONV_CONFIGS` and kept there."""
    m, n, k, c = args[4:8]
    key = conv_tiles.tile_key(codes["FP8"], codes["MODE"], m, n, k, c, form)
    section, hopper = conv_tiles.device_section(device.index or 0)
    tile = _tiles.find(key, (m, n, k, c), section, hopper, codes["FP8"], form)
    if tile is not None and (codes["MODE"] == GATHER or c % tile[2] == 0):
        config, warps, stages = tile_launch(tile, codes)
        grid = qk._grid(m, n, config)
        _conv_kernel[grid](*args, **codes, **config, num_warps=warps, num_stages=stages)
        return
    tuner = _tuned_kernel()
    start = time.perf_counter()
    tuner[qk._tuned_grid](*args, **codes)
    best = tuner.best_config
    kw = best.kwargs
    tile = (kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], best.num_warps, best.num_stages)
    _tiles.keep(key, tile, section, time.perf_counter() - start)


#: the epilogue codes that read the residual (`quant_kernels._epilogue_op`)
RESIDUAL_CODES = (2, 5)


def tile_launch(tile: tuple, codes: dict) -> tuple[dict, int, int]:
    """(the launch's constexprs, warps, stages) of a `conv_tiles` tile: its blocks, and
    `PRE_RES` (the residual's tile loaded before the product) where the tile asks for it and
    the epilogue reads a residual."""
    (bm, bn, bk, warps, stages), pre = conv_tiles.tile_form(tile)
    residual = any(codes[e] in RESIDUAL_CODES for e in ("E0", "E1", "E2"))
    config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
    return {**config, "PRE_RES": pre and residual}, warps, stages


def launch_arguments(
    x, wt, scale, out, geometry, epilogue=None, residual=None, qout=None, run=None
):  # fmt: skip
    """(`_conv_kernel`'s positional arguments, its constexprs but the tile) of `conv`'s
    launch, or None when the product is empty. fp8 operands go as their bytes (read as fp8
    on CUDA, as bytes elsewhere)."""
    n, c, h, w = x.shape
    if run is not None:
        _check_rows(x, geometry, run)
        c = run
    kw, (sh, sw), (ph, pw), (dh, dw), ho, wo = geometry
    m, k, c_out = n * ho * wo, wt.shape[1], wt.shape[0]
    if m == 0 or c_out == 0:
        return None
    fp8 = x.dtype == torch.float8_e4m3fn
    if x.dtype != wt.dtype or not (fp8 or x.dtype == torch.int8):
        raise ValueError(f"conv: int8 or fp8 e4m3 operands of one type, got {x.dtype}, {wt.dtype}")
    mode = input_mode(x, geometry) if run is None else ROWS
    sxn, sxc, sxh, sxw = x.stride()
    timed = qk._timed(x)
    if fp8:
        x, wt = x.view(torch.uint8), wt.view(torch.uint8)
    args = (
        x, wt, scale, out, m, c_out, k, c, h, w, ho, wo, sxn, sxh, sxw, sxc,
        wt.stride(0), out.stride(0), sh, sw, ph, pw, dh, dw, kw,
    )  # fmt: skip
    extra, codes = qk._epilogue_args(scale, epilogue, residual, qout)
    codes.update(FP8=fp8, MODE=mode, FP8_PTRS=fp8 and timed and qk.FP8_POINTERS)
    codes["FP8_NATIVE"] = fp8 and FP8_NATIVE
    # an fp8 quantising epilogue writes its bytes by the hardware conversion where the
    # quantise kernels do (`quantise_kernels.fp8_cast`: the same bytes, far fewer instructions)
    codes["CAST"] = codes["QUANT"] == 2 and qe.fp8_cast(out.device)
    codes["RECIP"] = codes["QUANT"] != 0 and reciprocal_quantise()
    return (*args, *extra), codes


def input_mode(x: torch.Tensor, geometry: tuple) -> int:
    """How `conv` reads `x` (N, C, H, W): POINTWISE, IMPLICIT or GATHER."""
    n, c, h, w = x.shape
    kw, stride, pads, _, ho, wo = geometry
    if c % CONV_BLOCK_K != 0 or not x.is_contiguous(memory_format=torch.channels_last):
        return GATHER
    if (kw, tuple(stride), tuple(pads), ho, wo) == (1, (1, 1), (0, 0), h, w):
        return POINTWISE
    return IMPLICIT


def row_layout(c: int, kw: int, dilation) -> tuple[int, int] | None:
    """(`c4`, `run`) of the `ROWS` mode for `c` input channels and kernel width `kw`: the
    channels padded to `c4` (a power of two, at least 4: 4-byte aligned pixels), one kernel
    row's `kw * c4` bytes padded to `run` (a multiple of `ROWS_BLOCK_K`); None where it does
    not apply (channels a multiple of `CONV_BLOCK_K`: read in place; dilation; runs over 128
    bytes)."""
    if c % CONV_BLOCK_K == 0 or any(d != 1 for d in dilation):
        return None
    c4 = max(4, triton.next_power_of_2(c))
    run = -(-kw * c4 // ROWS_BLOCK_K) * ROWS_BLOCK_K
    return (c4, run) if run <= 128 else None


def _check_rows(x: torch.Tensor, geometry: tuple, run: int) -> None:
    """`x` (N, c4, H, W) dense channels-last and wide enough that every window's `run` bytes
    lie inside it (`geometry` of the `ROWS` form)."""
    kw, (_, sw), pads, dilation, _, wo = geometry
    _, c4, _, w = x.shape
    dense = x.is_contiguous(memory_format=torch.channels_last) and x.stride(1) == 1
    if (kw, tuple(pads), tuple(dilation)) != (1, (0, 0), (1, 1)) or not dense or run % c4:
        raise ValueError(f"conv: a ROWS input is a padded NHWC copy, got {tuple(x.stride())}")
    if (wo - 1) * sw + run // c4 > w:
        raise ValueError(f"conv: ROWS input {w} wide, windows of {run // c4} need more")


@triton.jit
def _pad_rows_kernel(
    x_ptr, out_ptr, P, C, H, W, sxn, sxc, sxh, sxw, son, soh, sow, PH, PW,
    C4: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pix = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    w = pix % W
    h = (pix // W) % H
    n = pix // (W * H)
    c = tl.arange(0, C4)
    live = pix < P
    src = x_ptr + (n * sxn + h * sxh + w * sxw)[:, None] + (c * sxc)[None, :]
    v = tl.load(src, mask=live[:, None] & (c < C)[None, :], other=0)
    dst = out_ptr + (n * son + (h + PH) * soh + (w + PW) * sow)[:, None] + c[None, :]
    tl.store(dst, v, mask=live[:, None])


def pad_rows(x: torch.Tensor, buffer: torch.Tensor, pads: tuple[int, int]) -> None:
    """Copy the bytes of `x` (N, C, H, W, any strides, one byte an element) into the
    interior of the `ROWS` copy `buffer` (N, H + 2 ph, W', c4) bytes, dense): pixel (n, h, w)
    to (n, h + ph, w + pw), its channels past C written zero; the rest of `buffer` is not
    touched. One pass writing whole 4-byte pixels (torch's strided copy into the padded
    view took 0.022 ms for ResNet-50's stem input at batch 32 on an H200)."""
    n, c, h, w = x.shape
    c4 = buffer.shape[3]
    p = n * h * w
    if p == 0:
        return
    if x.element_size() != 1 or buffer.dtype != torch.uint8 or not buffer.is_contiguous():
        raise ValueError(f"pad_rows: byte tensors and a dense copy, got {x.dtype}, {buffer.dtype}")
    sxn, sxc, sxh, sxw = x.stride()
    son, soh, sow, _ = buffer.stride()
    block = 512
    _pad_rows_kernel[(triton.cdiv(p, block),)](
        x.view(torch.uint8), buffer, p, c, h, w, sxn, sxc, sxh, sxw, son, soh, sow, *pads,
        C4=c4, BLOCK=block, num_warps=4,
    )  # fmt: skip
