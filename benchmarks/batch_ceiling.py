"""How much dynamic batching can gain on a host: per-sample time by batch size, and the GEMM rate.

    python benchmarks/batch_ceiling.py                               # ResNet-50, cpu, all cores
    python benchmarks/batch_ceiling.py --model mobilenetv2 --batches 1 4 16 --threads 2

A server that gathers requests into batches can at most gain what running B samples at once
saves per sample: `ceiling = time(batch 1) / min over B of (time(batch B) / B)`. This script
compiles the built-in model for `cpu` at each batch size, times each with
`cpu_vs_peers.blockwise` (the median of `--repeat` runs after `--warmup`, the better of two
blocks), and prints per-sample milliseconds and that ceiling. It also times a large fp32
matrix product with torch at the same thread count and reports the model's achieved GFLOP/s
(its multiply-adds counted from its convolutions and GEMMs) against it: a model already near
the machine's fp32 GEMM rate at batch 1 has nothing left for batching to gain, whatever the
server does (issue 14's cpu line on a 2-core host).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_vs_peers import blockwise  # noqa: E402  (each engine in its own blocks, best of 2)

import pygraphx  # noqa: E402  (torch is imported after it: pygraphx sets OpenMP's wait policy)
from pygraphx.models import get_model, model_inputs  # noqa: E402


def model_macs(prog: Any) -> int:
    """Multiply-adds of the program's convolutions and matrix products (per run)."""
    total = 0
    for ins in prog.get_main_module().instructions:
        name = ins.op.name
        if name not in ("convolution", "dot", "quant_convolution", "quant_dot"):
            continue
        out = ins.shape.lens()
        if name.endswith("convolution"):
            w = ins.inputs[1].shape.lens()  # [K, C/groups, *kernel]
            total += int(np.prod(out)) * int(np.prod(w[1:]))
        else:
            k = ins.inputs[0].shape.lens()[-1]
            total += int(np.prod(out)) * int(k)
    return total


def gemm_gflops(threads: int, n: int = 2048) -> float:
    """fp32 GFLOP/s of an n x n x n torch matrix product at `threads` threads."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    ms = blockwise({"gemm": lambda _: a @ b}, {}, warmup=2, repeat=5)[0]["gemm"]
    return 2 * n**3 / (ms / 1e3) / 1e9


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Per-batch timings of the model and the GEMM reference."""
    rows = []
    for batch in args.batches:
        model = get_model(args.model, batch=batch)
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        macs = model_macs(prog)
        prog.compile(pygraphx.get_target("cpu", threads=args.threads))
        feeds = model_inputs(args.model, model, seed=0)
        ms = blockwise({"pgx": prog.run}, feeds, args.warmup, args.repeat)[0]["pgx"]
        rows.append(
            {
                "batch": batch,
                "ms": round(ms, 3),
                "ms_per_sample": round(ms / batch, 3),
                "gflops": round(2 * macs / (ms / 1e3) / 1e9, 1),
            }
        )
        print(
            f"{args.model} b{batch}: {ms:.1f} ms, {ms / batch:.2f} ms/sample, "
            f"{rows[-1]['gflops']} GFLOP/s",
            flush=True,
        )
    peak = gemm_gflops(args.threads)
    best = min(r["ms_per_sample"] for r in rows)
    first = rows[0]["ms_per_sample"]
    return {
        "model": args.model,
        "threads": args.threads,
        "machine": platform.processor() or platform.machine(),
        "rows": rows,
        "gemm_gflops": round(peak, 1),
        "ceiling": round(first / best, 3),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--threads", type=int, default=None, help="default: the cpu target's")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", metavar="FILE")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is None:
        from pygraphx.targets.cpu.threads import resolve_threads

        args.threads = resolve_threads().n
    result = measure(args)
    print(
        f"fp32 GEMM at {args.threads} threads: {result['gemm_gflops']} GFLOP/s; "
        f"batching can gain at most {result['ceiling']:.2f}x over batch {args.batches[0]}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
