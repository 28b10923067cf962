"""A/B of the resgpu changes on one GPU, each pair timed in this one process (`do_bench`,
L2 flushed between runs), ResNet-50 b32 shapes:

* the stem (7x7 stride 2, 3 -> 64 channels, bias + ReLU epilogue, half out) as GATHER (each
  byte gathered) against ROWS (the padded NHWC copy, its copy included), and cuDNN half;
* the stem's max pool: torch's channels-last half pool against `pool.max_pool_nhwc`;
* the 1x1 64 -> 256 layer at 56x56 with its bias + residual + ReLU + int8 quantise epilogue,
  for each tile at its `CONV_CONFIGS` stages and at two (one K block: `_shallow`).

    python benchmarks/resgpu_probe.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton.testing  # noqa: E402

from pygraphx.targets.gpu import quant_conv as qc  # noqa: E402
from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402
from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402
from pygraphx.targets.gpu.pool import max_pool_nhwc  # noqa: E402

CL = torch.channels_last


DEV = "cuda"
#: batch; `--smoke` runs each step once at batch 1 under TRITON_INTERPRET=1 on the CPU
BATCH = [32]


def bench(fn) -> float:
    if DEV == "cpu":
        fn()
        return 0.0
    return triton.testing.do_bench(fn, warmup=10, rep=50)


def launch(args, codes, m: int, n: int, tile: tuple) -> None:
    bm, bn, bk, warps, stages = tile
    config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
    grid = qk._grid(m, n, config)
    qck._conv_kernel[grid](*args, **codes, **config, num_warps=warps, num_stages=stages)


def stem(rows: dict) -> None:
    n, c, h, w, c_out = BATCH[0], 3, 224, 224, 64
    x = torch.randint(-128, 128, (n, c, h, w), dtype=torch.int8, device=DEV)
    wgt = torch.randint(-128, 128, (c_out, c, 7, 7), dtype=torch.int8, device=DEV)
    geo = SimpleNamespace(n=n, c=c, h=h, w=w, c_out=c_out, kh=7, kw=7, stride=[2, 2],
                          pad=[3, 3], dilation=[1, 1], ho=112, wo=112, rows=n * 112 * 112,
                          k=147)  # fmt: skip
    scale = torch.rand(c_out, device=DEV) * 1e-3
    ep = qk.Epilogue(["bias", "relu"], torch.randn(c_out, device=DEV))
    out = torch.empty((geo.rows, c_out), dtype=torch.float16, device=DEV)
    wt = wgt.permute(0, 2, 3, 1).reshape(c_out, 147).contiguous()
    geometry = (7, (2, 2), (3, 3), (1, 1), 112, 112)
    args, codes = qck.launch_arguments(x, wt, scale, out, geometry, ep)
    m = geo.rows
    rows["stem_gather"] = bench(lambda: launch(args, codes, m, c_out, (128, 64, 64, 4, 4)))
    reader = qc.input_reader(geo, torch.device(DEV))
    want = out.clone()
    wrows, rgeo = product_weights(wgt, geo), (1, (2, 2), (0, 0), (1, 1), 112, 112)
    for tile in [(128, 64, 32, 4, 4), (256, 64, 32, 8, 4), (128, 64, 32, 4, 2)]:
        a2, c2 = qck.launch_arguments(reader(x), wrows, scale, out, rgeo, ep, run=32)

        def rows_step(a2=a2, c2=c2, tile=tile) -> None:
            reader(x)
            launch(a2, c2, m, c_out, tile)

        rows[f"stem_rows{tile}"] = bench(rows_step)
        rows[f"stem_rows{tile}_equal_gather"] = torch.equal(out, want)
    rows["stem_rows_copy_only"] = bench(lambda: reader(x))
    xh = x.half().contiguous(memory_format=CL)
    wh = wgt.half().contiguous(memory_format=CL)
    rows["stem_cudnn_half"] = bench(lambda: F.conv2d(xh, wh, None, 2, 3))


def product_weights(wgt, geo):
    return qc._row_weights(wgt, geo, *qck.row_layout(geo.c, geo.kw, geo.dilation))


def pool(rows: dict) -> None:
    y = torch.randn((BATCH[0], 64, 112, 112), device=DEV).half().contiguous(memory_format=CL)
    out = torch.empty((BATCH[0], 64, 56, 56), dtype=torch.float16, device=DEV).contiguous(
        memory_format=CL
    )
    rows["pool_torch_half"] = bench(lambda: F.max_pool2d(y, 3, 2, 1))
    rows["pool_triton_half"] = bench(lambda: max_pool_nhwc(y, out, (3, 3), (2, 2), (1, 1)))
    assert torch.equal(out, F.max_pool2d(y, 3, 2, 1))


def shallow(rows: dict) -> None:
    n, c, h, w, c_out = BATCH[0], 64, 56, 56, 256
    m = n * h * w
    x = torch.randint(-128, 128, (n, c, h, w), dtype=torch.int8, device=DEV)
    x = x.contiguous(memory_format=CL)
    wt = torch.randint(-128, 128, (c_out, c), dtype=torch.int8, device=DEV)
    scale = torch.rand(c_out, device=DEV) * 1e-4
    res = torch.randn((m, c_out), device=DEV).half()
    ep = qk.Epilogue(["bias", "residual", "relu"], torch.randn(c_out, device=DEV),
                     torch.tensor([0.05], device=DEV))  # fmt: skip
    out = torch.empty((m, c_out), dtype=torch.float16, device=DEV)
    q = torch.empty((m, c_out), dtype=torch.int8, device=DEV)
    geometry = (1, (1, 1), (0, 0), (1, 1), h, w)
    args, codes = qck.launch_arguments(x, wt, scale, out, geometry, ep, res, q)
    for bm, bn, bk, warps, stages in qck.CONV_CONFIGS:
        if bk != 64 or bn >= 2 * c_out:
            continue
        for st in sorted({stages, 2}):
            tile = (bm, bn, bk, warps, st)
            rows[f"1x1_64_256{tile}"] = bench(lambda tile=tile: launch(args, codes, m, c_out, tile))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--smoke", action="store_true", help="CPU, batch 1, each step once")
    args = ap.parse_args()
    if args.smoke:
        global DEV
        DEV, BATCH[0] = "cpu", 1
    rows: dict = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu"}
    for part in (stem, pool, shallow):
        part(rows)
        print(json.dumps(rows, indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
