"""BERT-base's 8-bit products and quantises on one GPU, A/B in one process (CUDA only).

    python benchmarks/bertgpu_probe.py [--json out.json]

* GEMMs at 4096 rows (batch 32 x 128 tokens) with the epilogue the int8 program fuses
  (`ffn_up`: bias, GELU and the next product's int8 quantise, no half result; `ffn_down`:
  bias; `qkv`: none), by `quant_kernels.int8_gemm` with its pointer kernel
  (`TMA_GEMM` "0", the default) and with the TMA kernel (`TMA_GEMM` "1"), each autotuned
  afresh (every configuration's time is recorded) and checked to give the same bytes; and the
  peers: cuBLAS half (`torch.matmul`), `torch._int_mm` (int32 out) and `torch._scaled_mm`
  (fp8, half out). `ffn_up_plain`: the same product with no epilogue (the epilogue's cost).
* the fp8 quantise (`quantise_kernels.quantise_fp8`, [4096, 768] half) with the byte built from
  float32 bits (`PGX_GPU_FP8_CAST=0`) and by the hardware conversion (the default where the
  device has one): time and same bytes.

Times: median of `triton.testing.do_bench_cudagraph` (replayed from a CUDA graph, as the gpu
executable runs them) after the autotuning call, in ms.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quant_tiles_ab import graph_ms  # noqa: E402  (graph-replayed median, shared)

from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402
from pygraphx.targets.gpu import quantise_kernels as qe  # noqa: E402

ROWS = 4096
#: (name, N, K, epilogue ops, quantised and not stored)
SHAPES = [
    ("ffn_up", 3072, 768, ("bias", "gelu"), True),
    ("ffn_up_plain", 3072, 768, (), False),
    ("ffn_down", 768, 3072, ("bias",), False),
    ("qkv", 2304, 768, (), False),
]


def _describe(cfg) -> str:
    kw = cfg.kwargs
    tile = f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{cfg.num_warps} s{cfg.num_stages}"
    return tile + (" persistent" if kw.get("PERSISTENT") else "")


def _first(t) -> float:
    return float(t[0]) if isinstance(t, (list, tuple)) else float(t)


def _tuner(tma: bool):
    return qk._tma_kernel() if tma else qk._tuned_kernel("gemm")


def gemm_row(name: str, n: int, k: int, ops: tuple, quant: bool) -> dict:
    """Pointer vs TMA int8 kernel (same bytes?) and the cuBLAS peers for one product."""
    dev = "cuda"
    a = torch.randint(-128, 128, (ROWS, k), device=dev, dtype=torch.int8)
    wt = torch.randint(-128, 128, (n, k), device=dev, dtype=torch.int8)
    scale = torch.rand(n, device=dev) * 2e-4 + 1e-5
    bias = torch.randn(n, device=dev) * 0.1
    qs = torch.tensor([0.05], device=dev)
    ep = qk.Epilogue(
        ops,
        bias=bias if "bias" in ops else None,
        quant_scale=qs if quant else None,
        store=not quant,
        gelu=(1 / math.sqrt(2), 1.0, 0.5),
    )
    row: dict = {"name": name, "m": ROWS, "n": n, "k": k, "ops": list(ops), "quant": quant}
    outs = {}
    for tma in (False, True):
        qk.TMA_GEMM = "1" if tma else "0"
        tuner = _tuner(tma)
        tuner.cache.clear()
        out = torch.empty(ROWS, n, device=dev, dtype=torch.half)
        qout = torch.empty(ROWS, n, device=dev, dtype=torch.int8) if quant else None
        key = "tma" if tma else "ptr"
        try:
            row[key] = graph_ms(lambda o=out, q=qout: qk.int8_gemm(a, wt, scale, o, ep, None, q))
        except Exception as exc:  # noqa: BLE001  (a probe: record why a variant failed)
            row[key] = None
            row[f"{key}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            continue
        row[f"{key}_tile"] = _describe(tuner.best_config)
        timings = getattr(tuner, "configs_timings", None) or {}
        row[f"{key}_configs"] = {_describe(c): _first(t) for c, t in timings.items()}
        outs[key] = qout if quant else out
    if len(outs) == 2:
        row["same_bytes"] = bool(torch.equal(outs["ptr"], outs["tma"]))
    ah, wh = a.half(), wt.half().t()
    row["cublas_fp16"] = graph_ms(lambda: torch.matmul(ah, wh))
    wcol = wt.t()
    row["int_mm"] = graph_ms(lambda: torch._int_mm(a, wcol))
    a8, w8 = a.to(torch.float8_e4m3fn), wt.to(torch.float8_e4m3fn)
    one = torch.ones((), device=dev)
    row["scaled_mm"] = graph_ms(
        lambda: torch._scaled_mm(a8, w8.t(), one, one, out_dtype=torch.half)
    )
    return row


def fp8_quantise_row(n: int, k: int) -> dict:
    """`quantise_fp8` with the byte from float32 bits and from the hardware conversion."""
    x = torch.randn(n, k, device="cuda", dtype=torch.half) * 3
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e4])
    s = torch.tensor([0.011], device="cuda")
    row: dict = {"shape": [n, k]}
    got = {}
    for cast in ("0", "1"):
        os.environ[qe.FP8_CAST_ENV] = cast
        out = torch.empty(n, k, device="cuda", dtype=torch.float8_e4m3fn)
        row[f"cast{cast}"] = graph_ms(lambda o=out: qe.quantise_fp8(x, s, o))
        got[cast] = out.view(torch.uint8).clone()
    os.environ.pop(qe.FP8_CAST_ENV)
    row["cast_supported"] = qe.fp8_cast_supported(x.device)
    row["same_bytes"] = bool(torch.equal(got["0"], got["1"]))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    result["triton"] = triton.__version__
    result["gemm"] = []
    for shape in SHAPES:
        row = gemm_row(*shape)
        result["gemm"].append(row)
        keep = ("ptr", "ptr_tile", "tma", "tma_tile", "same_bytes", "cublas_fp16", "int_mm")
        print(row["name"], {k: row.get(k) for k in (*keep, "scaled_mm")}, flush=True)
        for key in ("ptr_error", "tma_error"):
            if key in row:
                print("   ", key, row[key], flush=True)
    qk.TMA_GEMM = None
    result["fp8_quantise"] = [fp8_quantise_row(4096, 768), fp8_quantise_row(4096, 3072)]
    for row in result["fp8_quantise"]:
        print("fp8 quantise", row, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
