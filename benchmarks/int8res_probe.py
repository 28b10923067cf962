"""Where ResNet-50's int8 convolutions lose to the fused fp16 ones: per layer, tiles, forms.

    python benchmarks/int8res_probe.py [--json out.json] [--layers NAME ...]
        [--fp8-layers NAME ...] [--tma] [--jobs 16]

For the ResNet-50 b32 layers where the int8 program lost to the fused fp16 one on an H100
(`benchmarks/results/int8res_layers.md`), channels-last, device time from CUDA-graph replays
(`triton.testing.do_bench_cudagraph`, median), each layer in one process run:

* `fp16`: cuDNN's fused convolution + bias (+ residual) + ReLU (`torch.cudnn_convolution_relu`
  / `_add_relu`, the fp16 program's `conv_epilogue` form) or the bare `F.conv2d` half;
* `int8 <tile>`: `quant_conv_kernels._conv_kernel` with the program's epilogue (bias, ReLU,
  int8 quantise with the float store; the expansions with the residual) at every tile
  `_prune` keeps from `CONV_CONFIGS` + `fp8conv_probe.EXTRA`; `conv_tiles.TABLE`'s marked;
* `int8 pre <tile>`: the residual's tile loaded before the product (`PRE_RES`);
* `tma <tile>` (`--tma`, 1x1 stride-1 layers: a plain GEMM of the NHWC rows):
  `quant_kernels._tma_gemm_kernel` with the same epilogue;
* `fp8n <tile>`, `fp8n pre ...`: the fp8 kernel (native accumulation) at the tables' tiles
  (`table`: `FP8_TABLE` / `TABLE`; `h100`: `H100_FP8_TABLE`'s, else `H100_TABLE`'s int8
  tile: the second call, `h100_int8res_probe2`, ran before `H100_FP8_TABLE`) and `FP8_TILES`;

`--fp8-layers`: layers timed without the int8 sweep (int8 at the tables' tiles only).

The H100 call of 54e2cb9 (`benchmarks/results/h100_int8res_probe.{txt,json}`) also timed
split-K (`int8 split<S> <tile>`: S programs a tile over K, the last to finish summing the
partials from a workspace and running the epilogue), for the 3x3 layers of 256 / 512 channels:
it lost (3x3 512 at 7x7: 23.13 us at its best against 23.37 unsplit; 3x3 256 at 14x14 22.36
against 16.98) and was removed from the kernel. `conv_tiles.H100_TABLE` comes from this probe.

The kernels are first compiled in `--jobs` worker processes (Triton's disk cache then serves
this process).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8conv_probe import tiles  # noqa: E402  (`_prune`'s tiles of CONV_CONFIGS + EXTRA)
from quant_conv_probe import Layer, bench  # noqa: E402

from pygraphx.targets.gpu import conv_tiles  # noqa: E402
from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402
from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402

#: name -> ((N, C, H, W, C_out, k, stride, pad), epilogue): `quant_conv_probe.Layer.epilogue`
LAYERS = {
    "1x1_64_256_56_res": ((32, 64, 56, 56, 256, 1, 1, 0), "bresq"),
    "1x1_128_512_28_res": ((32, 128, 28, 28, 512, 1, 1, 0), "bresq"),
    "1x1_256_1024_14_res": ((32, 256, 14, 14, 1024, 1, 1, 0), "bresq"),
    "1x1_512_2048_7_res": ((32, 512, 7, 7, 2048, 1, 1, 0), "bresq"),
    "1x1s2_256_512_56_res": ((32, 256, 56, 56, 512, 1, 2, 0), "bresq"),
    "3x3_512_7": ((32, 512, 7, 7, 512, 3, 1, 1), "brq"),
    "3x3_256_14": ((32, 256, 14, 14, 256, 3, 1, 1), "brq"),
    "1x1_64_64_56": ((32, 64, 56, 56, 64, 1, 1, 0), "brq"),
    "1x1_512_256_28": ((32, 512, 28, 28, 256, 1, 1, 0), "brq"),
    "1x1_1024_512_14": ((32, 1024, 14, 14, 512, 1, 1, 0), "brq"),
    "1x1s2_512_1024_28_res": ((32, 512, 28, 28, 1024, 1, 2, 0), "bresq"),
    "1x1s2_1024_2048_14_res": ((32, 1024, 14, 14, 2048, 1, 2, 0), "bresq"),
}
#: fp8 tiles timed besides the tables' (where `_prune` keeps them)
FP8_TILES = [(64, 64, 128, 4, 3), (128, 64, 128, 4, 3), (64, 64, 64, 4, 2), (64, 64, 128, 4, 2)]
#: tiles (besides the table's) timed with the residual loaded before the product
PRE_TILES = [(128, 64, 64, 4, 4), (64, 128, 128, 4, 4), (128, 128, 64, 4, 4)]


def conv_launch(layer: Layer, kind: str, ep_name: str, tile: tuple, pre: bool = False):
    """A zero-argument launch of `_conv_kernel` (`pre`: the residual loaded first)."""
    ep, res, qout = layer.epilogue(ep_name, kind)
    args, codes = qck.launch_arguments(
        layer.x[kind], layer.w[kind], layer.scale, layer.out, layer.geometry, ep, res, qout
    )
    codes["FP8_NATIVE"] = kind == "fp8n"
    bm, bn, bk, warps, stages = tile
    config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
    grid = qk._grid(layer.rows, layer.c_out, config)

    def run() -> None:
        qck._conv_kernel[grid](
            *args, **codes, **config, PRE_RES=pre, num_warps=warps, num_stages=stages
        )

    return run


def tma_launch(layer: Layer, ep_name: str, cfg: tuple):
    """A zero-argument launch of `quant_kernels._tma_gemm_kernel` on the 1x1 layer's rows."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    ep, res, qout = layer.epilogue(ep_name, "int8")
    x = layer.x["int8"]
    a = x.permute(0, 2, 3, 1).reshape(layer.rows, x.shape[1])
    wt = layer.w["int8"]
    m, k = a.shape
    n = wt.shape[0]
    bm, bn, bk, warps, stages, persistent = cfg
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [bm, bk])
    w_desc = TensorDescriptor(wt, [n, k], [wt.stride(0), 1], [bn, bk])
    extra, codes = qk._epilogue_args(layer.scale, ep, res, qout)
    config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "PERSISTENT": persistent}
    tiles_ = qk._grid(m, n, config)[0]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = (min(tiles_, sms * qk.PERSISTENT_PER_SM) if persistent else tiles_,)
    args = (a_desc, w_desc, layer.scale, layer.out, m, n, k, layer.out.stride(0), *extra)

    def run() -> None:
        qk._tma_gemm_kernel[grid](*args, **codes, **config, num_warps=warps, num_stages=stages)

    return run


def fp16_launch(layer: Layer, shape: tuple, ep_name: str):
    stride, pad = layer.conv
    x, w = layer.half_x, layer.half_w
    bias = layer.bias
    if ep_name == "-":
        return lambda: F.conv2d(x, w, None, stride, pad)
    args = ([stride] * 2, [pad] * 2, [1, 1], 1)
    if "res" in ep_name:
        n, c, h, ww, c_out, k, s, p = shape
        z = torch.randn(n, c_out, layer.ho, layer.wo, device="cuda").half()
        z = z.contiguous(memory_format=torch.channels_last)
        return lambda: torch.cudnn_convolution_add_relu(x, w, z, 1.0, bias, *args)
    return lambda: torch.cudnn_convolution_relu(x, w, bias, *args)


def _key(shape: tuple) -> tuple[int, int, int, int]:
    """The `conv_tiles` table key (M, N, K, C) of a layer shape."""
    n, c, h, w, c_out, k, stride, pad = shape
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    return (n * ho * wo, c_out, k * k * c, c)


def variants(name: str, sweep: bool = True, tma: bool = False) -> list[tuple[str, callable]]:
    """(label, launch maker) of every variant timed for layer `name`: fp16; int8 at every tile
    (`sweep`; else at the tables' tiles only) with the early residual at `PRE_TILES`; fp8 at
    the tables' tiles and `FP8_TILES`; the TMA GEMM (`tma`, 1x1 stride-1 layers)."""
    shape, ep = LAYERS[name]
    n, c, h, w, c_out, k, stride, pad = shape
    key = _key(shape)
    h100, h100f = (
        None if t is None else conv_tiles.tile_form(t)[0]
        for t in (conv_tiles.H100_TABLE.get(key), conv_tiles.H100_FP8_TABLE.get(key))
    )
    tab, ftab = (
        conv_tiles.TABLE.get(key),
        conv_tiles.FP8_TABLE.get(key) or conv_tiles.TABLE.get(key),
    )
    marks = {
        "int8": {tab: " table", h100: " h100"},
        "fp8n": {ftab: " table", (h100f or h100): " h100"},
    }
    out = [("fp16 cudnn", lambda lay: fp16_launch(lay, shape, ep))]
    for kind in ("int8", "fp8n"):
        named = {t for t in marks[kind] if t is not None}
        if kind == "int8" and sweep:
            chosen = set(tiles(shape)) | named
        else:
            chosen = named | (set(FP8_TILES) & set(tiles(shape)) if kind == "fp8n" else set())
        for t in sorted(chosen):
            mark = "".join(v for u, v in marks[kind].items() if u == t)
            out.append(
                (f"{kind} {t}{mark}", lambda lay, t=t, kind=kind: conv_launch(lay, kind, ep, t))
            )
            if "res" in ep and (t in named or (kind == "int8" and t in PRE_TILES)):
                out.append(
                    (
                        f"{kind} pre {t}",
                        lambda lay, t=t, kind=kind: conv_launch(lay, kind, ep, t, pre=True),
                    )
                )
    if tma and k == 1 and stride == 1:
        for cfg in qk.TMA_CONFIGS:
            if cfg[1] <= 2 * c_out and cfg[2] <= c:
                out.append((f"tma {cfg}", lambda lay, cfg=cfg: tma_launch(lay, ep, cfg)))
    return out


#: variants compiled by one worker job
CHUNK = 6


def _compile(job: tuple[str, int, bool, bool]) -> str:
    """Compile (and run once) `CHUNK` variants of one layer: fills Triton's disk cache."""
    name, start, sweep, tma = job
    layer = Layer(LAYERS[name][0])
    failed = []
    found = variants(name, sweep, tma)[start : start + CHUNK]
    for label, make in found:
        try:
            make(layer)()
        except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
            failed.append(f"{label}: {type(exc).__name__} {str(exc)[:100]}")
    torch.cuda.synchronize()
    return f"{name}[{start}:]: {len(found)} variants" + (f", failed {failed}" if failed else "")


def probe(name: str, sweep: bool, tma: bool) -> dict:
    layer = Layer(LAYERS[name][0])
    row = {}
    for label, make in variants(name, sweep, tma):
        try:
            row[label] = bench(make(layer)) * 1e3
        except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
            row[label] = f"{type(exc).__name__}: {str(exc)[:120]}"
    ok = {k: v for k, v in row.items() if isinstance(v, float)}
    print(f"{name}: fp16 {ok.get('fp16 cudnn', float('nan')):.2f} us")
    for kind, top in (("int8", 6), ("fp8n", 4), ("tma", 2)):
        for label, us in sorted(((k, v) for k, v in ok.items() if k.startswith(kind)),
                                key=lambda kv: kv[1])[:top]:  # fmt: skip
            print(f"    {us:7.2f} us  {label}")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument(
        "--fp8-layers", nargs="*", default=[],
        help="layers timed at the tables' tiles only (no int8 sweep)",
    )  # fmt: skip
    ap.add_argument("--tma", action="store_true", help="time the TMA GEMM on 1x1 layers too")
    ap.add_argument("--jobs", type=int, default=16)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    runs = [(n, n not in args.fp8_layers) for n in dict.fromkeys(args.layers + args.fp8_layers)]
    jobs = [
        (n, i, sweep, args.tma)
        for n, sweep in runs
        for i in range(0, len(variants(n, sweep, args.tma)), CHUNK)
    ]
    with multiprocessing.get_context("spawn").Pool(min(args.jobs, len(jobs))) as pool:
        for line in pool.imap_unordered(_compile, jobs):
            print("compiled", line, flush=True)
    found = {"device": torch.cuda.get_device_name(), "triton": triton.__version__}
    found["layers"] = {name: probe(name, sweep, args.tma) for name, sweep in runs}
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
