"""Where ResNet-50's 1x1 expansions spend their time with an 8-bit residual (issue 12).

    python benchmarks/int8r_probe.py [--json out.json]

For the four expansion shapes at batch 32 (channels-last, H100 device time from CUDA-graph
replays, `quant_conv_probe.bench`), each epilogue form of `quant_conv_kernels._conv_kernel` at
a sweep of tiles, against cuDNN's fused half convolution + bias + residual + ReLU:

* `bare`: the int8 product and its scale only, written in half;
* `bq`: bias, ReLU, the int8 quantise only (no float store, no residual);
* `bresq`: bias, half residual, ReLU, quantise and the half store (`quantize_int8`'s form);
* `br8q`: bias, int8 residual with its scale (`residual_affine`), ReLU, the int8 quantise
  only (`quantize_int8(..., residuals=True)`'s form);
* `... pre`: the residual tile loaded before the product (`PRE_RES`);
* `... R`: the quantise as the product by the scale's reciprocal (`RECIP`), not the exact
  quotient (fewer instructions; not `ref`'s numbers at near-ties).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quant_conv_probe import Layer, bench  # noqa: E402

from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402
from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402

#: the expansions (with a residual), then layers without one (bias + ReLU: `bq` forms only)
SHAPES = {
    "1x1_64_256_56": (32, 64, 56, 56, 256, 1, 1, 0),
    "1x1_256_64_56 reduce": (32, 256, 56, 56, 64, 1, 1, 0),
    "3x3_64_56": (32, 64, 56, 56, 64, 3, 1, 1),
    "3x3_128_28": (32, 128, 28, 28, 128, 3, 1, 1),
    "3x3_256_14": (32, 256, 14, 14, 256, 3, 1, 1),
    "1x1_128_512_28": (32, 128, 28, 28, 512, 1, 1, 0),
    "1x1_256_1024_14": (32, 256, 14, 14, 1024, 1, 1, 0),
    "1x1_512_2048_7": (32, 512, 7, 7, 2048, 1, 1, 0),
}
TILES = [
    (128, 64, 64, 4, 2), (128, 128, 64, 4, 2), (128, 128, 64, 8, 2), (64, 128, 64, 4, 2),
    (256, 64, 64, 8, 2), (64, 64, 64, 4, 2), (128, 64, 64, 8, 2),
]  # fmt: skip


def forms(layer: Layer) -> dict:
    """name -> (Epilogue or None, residual, qout, PRE_RES, RECIP)."""
    q8 = torch.empty_like(layer.out, dtype=torch.int8)
    r8 = torch.randint(-128, 128, layer.res.shape, device="cuda", dtype=torch.int8)
    rs = torch.full((layer.c_out,), 0.02, device="cuda")
    rb = torch.zeros(layer.c_out, device="cuda")
    ops3 = ["bias", "residual", "relu"]
    aff = ["bias", "residual_affine", "relu"]
    bq = qk.Epilogue(["bias", "relu"], layer.bias, layer.qs, store=False)
    br8q = qk.Epilogue(aff, layer.bias, layer.qs, store=False, residual_affine=(rs, rb))
    return {
        "bare": (None, None, None, False, False),
        "bq": (bq, None, q8, False, False),
        "bq R": (bq, None, q8, False, True),
        "bresq": (qk.Epilogue(ops3, layer.bias, layer.qs), layer.res, q8, False, False),
        "br8q pre": (br8q, r8, q8, True, False),
        "br8q pre R": (br8q, r8, q8, True, True),
    }  # fmt: skip


def launch(layer: Layer, form: tuple, tile: tuple):
    ep, res, qout, pre, recip = form
    args, codes = qck.launch_arguments(
        layer.x["int8"], layer.w["int8"], layer.scale, layer.out, layer.geometry, ep, res, qout
    )
    bm, bn, bk, warps, stages = tile
    config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "PRE_RES": pre,
              "RECIP": recip}  # fmt: skip
    grid = qk._grid(layer.rows, layer.c_out, config)

    def run():
        qck._conv_kernel[grid](*args, **codes, **config, num_warps=warps, num_stages=stages)

    return run


def cudnn_fused(layer: Layer, residual: bool):
    w = layer.half_w
    stride, pad = layer.conv
    if not residual:
        return lambda: torch.cudnn_convolution_relu(
            layer.half_x, w, layer.bias, (stride, stride), (pad, pad), (1, 1), 1
        )
    z = layer.res.view(-1).view(layer.out.shape)  # (rows, c_out) as NHWC
    n = layer.half_x.shape[0]
    z4 = z.view(n, layer.ho, layer.wo, layer.c_out).permute(0, 3, 1, 2)

    def run():
        torch.cudnn_convolution_add_relu(
            layer.half_x, w, z4, 1.0, layer.bias, (stride, stride), (pad, pad), (1, 1), 1
        )

    return run


def report(fname: str, row: dict) -> None:
    """Print form `fname`'s best tile and the next three times."""
    timed = [(v, k) for k, v in row.items() if k.startswith(fname + " (")]
    best = sorted(t for t in timed if not isinstance(t[0], str))
    if best:
        rest = [round(v * 1e3, 1) for v, _ in best[1:4]]
        print(f"  {fname:10s} best {best[0][0] * 1e3:6.1f} us at {best[0][1]}  (next {rest})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    args = ap.parse_args()
    out = {}
    for name in args.shapes:
        layer = Layer(SHAPES[name])
        residual = SHAPES[name][5] == 1 and SHAPES[name][4] > SHAPES[name][1]  # an expansion
        row = {"cudnn fp16": bench(cudnn_fused(layer, residual))}
        for fname, form in forms(layer).items():
            if not residual and form[1] is not None:
                continue
            for tile in TILES:
                if tile[1] > 2 * layer.c_out or layer.x["int8"].shape[1] % tile[2]:
                    continue
                try:
                    row[f"{fname} {tile}"] = bench(launch(layer, form, tile))
                except Exception as exc:  # noqa: BLE001 (a tile that does not compile: said)
                    row[f"{fname} {tile}"] = f"failed: {type(exc).__name__}"
        out[name] = row
        print(f"{name}: cudnn {row['cudnn fp16'] * 1e3:.1f} us", flush=True)
        for fname in forms(layer):
            report(fname, row)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
