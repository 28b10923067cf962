"""Which tiles suit the fp8 convolution kernel: ResNet-50 b32 layers, int8 and fp8, every tile.

    python benchmarks/fp8conv_probe.py [--json out.json] [--layers NAME ...] [--jobs 12]

For the layers where the fp8 kernel ran slower than the int8 one at the int8-tuned tiles
(`benchmarks/results/h100_fp8conv_resnet50_b32.txt`: ResNet-50's 56x56 and 28x28 stages), each
of `int8` and `fp8` (Hopper's native accumulation, `qck.FP8_NATIVE`) with the program's
epilogue (`quant_conv_probe.Layer`: bias + ReLU + quantise, the expansions with the residual
too) at every tile `quant_conv_kernels._prune` keeps from `CONV_CONFIGS` plus `EXTRA`:
device time from CUDA-graph replays (`triton.testing.do_bench_cudagraph`, median), sorted.
`conv_tiles.TABLE`'s tile of the shape is marked. The kernels are first compiled in `--jobs`
worker processes (one per layer and kind; Triton's on-disk cache then serves this process),
so the probe takes about a minute rather than one compile after another.

`--reads`: only, for a few layers at one tile (`READS`), the fp8 kernel reading its tiles
through fp8 pointers (the default on CUDA) against bytes bitcast in registers, and int8.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quant_conv_probe import Layer, bench  # noqa: E402

from pygraphx.targets.gpu import conv_tiles  # noqa: E402
from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402

#: tiles timed besides `CONV_CONFIGS` (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
EXTRA = [
    (128, 64, 128, 4, 3), (256, 64, 128, 8, 3), (64, 64, 128, 4, 3), (128, 128, 128, 4, 3),
    (128, 64, 64, 8, 4), (64, 64, 64, 4, 3), (256, 128, 64, 8, 3),
]  # fmt: skip
#: name -> ((N, C, H, W, C_out, k, stride, pad), epilogue)
LAYERS = {
    "1x1_256_64_56": ((32, 256, 56, 56, 64, 1, 1, 0), "brq"),
    "3x3_64_56": ((32, 64, 56, 56, 64, 3, 1, 1), "brq"),
    "1x1_64_64_56": ((32, 64, 56, 56, 64, 1, 1, 0), "brq"),
    "1x1_64_256_56": ((32, 64, 56, 56, 256, 1, 1, 0), "bresq"),
    "1x1_256_128_56": ((32, 256, 56, 56, 128, 1, 1, 0), "brq"),
    "3x3_128_28": ((32, 128, 28, 28, 128, 3, 1, 1), "brq"),
    "1x1_512_128_28": ((32, 512, 28, 28, 128, 1, 1, 0), "brq"),
}
KINDS = ("int8", "fp8n")


def tiles(shape: tuple) -> list[tuple]:
    """The tiles `_prune` keeps for the layer `shape` from `CONV_CONFIGS` + `EXTRA`."""
    n, c, h, w, c_out, k, _, _ = shape
    configs = [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                      num_warps=warps, num_stages=stages)
        for bm, bn, bk, warps, stages in [*qck.CONV_CONFIGS, *EXTRA]
    ]  # fmt: skip
    kept = qck._prune(configs, {"C": c, "N": c_out, "K": k * k * c}, MODE=qck.IMPLICIT)
    return sorted({
        (cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"], cfg.num_warps,
         cfg.num_stages)
        for cfg in kept
    })  # fmt: skip


def _compile(job: tuple[str, str]) -> str:
    """Compile (and run once) every tile of one layer and kind: fills Triton's disk cache."""
    name, kind = job
    shape, ep = LAYERS[name]
    layer = Layer(shape)
    failed = []
    for tile in tiles(shape):
        try:
            layer.launch(kind, ep, tile)()
        except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
            failed.append(f"{tile}: {type(exc).__name__}")
    torch.cuda.synchronize()
    return f"{name} {kind}: {len(tiles(shape))} tiles" + (f", failed {failed}" if failed else "")


def probe(name: str) -> dict:
    shape, ep = LAYERS[name]
    layer = Layer(shape)
    n, c, h, w, c_out, k, _, _ = shape
    table = conv_tiles.TABLE.get((layer.rows, c_out, k * k * c, c))
    row = {"table_tile": table}
    for kind in KINDS:
        times = {}
        for tile in tiles(shape):
            try:
                times[str(tile)] = bench(layer.launch(kind, ep, tile))
            except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                times[str(tile)] = f"{type(exc).__name__}: {str(exc)[:120]}"
        row[kind] = dict(sorted(times.items(), key=lambda kv: str(kv[1])))
        ok = {t: v for t, v in times.items() if isinstance(v, float)}
        best = min(ok, key=ok.get)
        at = ok.get(str(table))
        at = "-" if at is None else f"{at * 1e3:7.2f} us"
        print(f"{name:16s} {kind:5s} best {best} {ok[best] * 1e3:7.2f} us   table {table} {at}")
    return row


#: layer -> tile of the fp8 read A/B (`reads`)
READS = {"3x3_64_56": (128, 64, 64, 4, 4), "3x3_128_28": (128, 64, 128, 4, 3),
         "1x1_256_128_56": (64, 64, 128, 4, 2)}  # fmt: skip


def reads(name: str, tile: tuple) -> dict:
    """The fp8 kernel at `tile` reading its tiles through fp8 pointers (`FP8_PTRS`, the
    default on CUDA) against bytes bitcast to fp8 in registers, and int8 at the same tile."""
    shape, ep = LAYERS[name]
    layer = Layer(shape)
    bm, bn, bk, warps, stages = tile
    config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
    grid = qck.qk._grid(layer.rows, layer.c_out, config)
    row = {}
    for label, kind, pointers in (("int8", "int8", False), ("fp8 pointers", "fp8n", True),
                                  ("fp8 bytes", "fp8n", False)):  # fmt: skip
        ep_, res, qout = layer.epilogue(ep, kind)
        args, codes = qck.launch_arguments(
            layer.x[kind], layer.w[kind], layer.scale, layer.out, layer.geometry, ep_, res, qout
        )
        codes.update(FP8_NATIVE=kind == "fp8n", FP8_PTRS=pointers and kind != "int8")

        def run(args=args, codes=codes) -> None:
            qck._conv_kernel[grid](*args, **codes, **config, num_warps=warps, num_stages=stages)

        row[label] = bench(run)
    print(f"{name:16s} {tile} " + "  ".join(f"{k} {v * 1e3:6.2f} us" for k, v in row.items()))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--layers", nargs="+", default=list(LAYERS))
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--reads", action="store_true", help="only the fp8 read A/B (`READS`)")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    if args.reads:
        found = {name: reads(name, tile) for name, tile in READS.items()}
        if args.json:
            Path(args.json).write_text(json.dumps(found, indent=1))
        return 0
    jobs = [(name, kind) for name in args.layers for kind in KINDS]
    with multiprocessing.get_context("spawn").Pool(min(args.jobs, len(jobs))) as pool:
        for line in pool.imap_unordered(_compile, jobs):
            print("compiled", line, flush=True)
    found = {"device": torch.cuda.get_device_name(), "triton": triton.__version__}
    found["layers"] = {name: probe(name) for name in args.layers}
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
