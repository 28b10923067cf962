"""BERT-base's fixed-weight products: torch's oneDNN linear against oneDNN's matmul primitive
through its C API (`onednn_linear.Linear`), warm and after a 64 MiB write (weights cold).

    PYTHONPATH=. python benchmarks/xf11_gemm.py --threads 1 --dtype bfloat16

The two kernels alternate call by call (which goes first alternates too); printed: each one's
median wall time per call in us, and the matmul primitive's implementation.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pygraphx.targets.torch_lowering.onednn_linear import Linear  # noqa: E402

SHAPES = ((128, 768, 768), (128, 768, 3072), (128, 3072, 768))


def kernels(m: int, k: int, n: int, dtype: torch.dtype) -> tuple[dict, float]:
    """The two kernels of an (m, k) x (k, n) product with a bias, and their largest
    difference from a float64 product."""
    w, b = (torch.randn(k, n) * 0.05).to(dtype), torch.randn(n).to(dtype)
    x = torch.randn(m, k).to(dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), m)
    linear = torch.ops.mkldnn._linear_pointwise
    matmul = Linear(w, b, m)
    fns = {"torch": lambda: linear(x, packed, b, "none", [], ""), "matmul": lambda: matmul(x)}
    want = x.double() @ w.double() + b.double()
    err = max(float((f().double() - want).abs().max()) for f in fns.values())
    return fns, err


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    flush = torch.ones(64 << 20, dtype=torch.uint8)
    for m, k, n in SHAPES:
        fns, err = kernels(m, k, n, getattr(torch, args.dtype))
        warm: dict[str, list[float]] = {name: [] for name in fns}
        cold: dict[str, list[float]] = {name: [] for name in fns}
        for r in range(args.calls):
            for name in list(fns)[:: 1 if r % 2 else -1]:
                start = time.perf_counter()
                fns[name]()
                warm[name].append(time.perf_counter() - start)
                flush.add_(1)
                start = time.perf_counter()
                fns[name]()
                cold[name].append(time.perf_counter() - start)
        cells = "  ".join(f"{name} warm {np.median(warm[name]) * 1e6:7.1f} cold "
                          f"{np.median(cold[name]) * 1e6:7.1f}" for name in fns)  # fmt: skip
        print(f"t{args.threads} {args.dtype} {m}x{k}x{n}: {cells} (max err {err:.1e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
