"""MobileNetV2's classifier GEMV (1 x 1280 @ 1280 x 1000 + bias) at batch 1 with a cold weight:
candidate kernels in one process, interleaved call by call, caches flushed before each call by
a numpy pass over `--flush-mb` (numpy: no OpenMP pool of its own).

    python benchmarks/tail12_gemv_probe.py --threads 2 --calls 200
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401  (first: OpenMP's spin count before torch)
import torch  # noqa: E402

from pygraphx.targets.torch_lowering import onednn_linear  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flush-mb", type=int, default=64)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--k", type=int, default=1280)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--read-flush", action="store_true", help="flush by reading (clean lines)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    k, n = args.k, args.n
    g = torch.Generator().manual_seed(0)
    w_nk = torch.randn(n, k, generator=g) * 0.02  # ONNX Gemm's B with transB=1
    b = torch.randn(n, generator=g)
    x = torch.randn(1, k, generator=g)
    want = (x.double() @ w_nk.double().t() + b.double())
    w_kn_view = w_nk.t()
    w_kn = w_nk.t().contiguous()
    lin1 = onednn_linear.Linear(w_kn, b, 1)
    lin2 = onednn_linear.Linear(w_kn, b, 1, parts=2)
    lin4 = onednn_linear.Linear(w_kn, b, 1, parts=4)
    lin8 = onednn_linear.Linear(w_kn, b, 1, parts=8)
    jit = {}
    for tag_name, tag in (("any", 1), ("ab", 3), ("ba", 14)):
        saved, onednn_linear.TAG_ANY = onednn_linear.TAG_ANY, tag
        try:
            jit[tag_name] = onednn_linear.Linear(w_kn, b, 1, impl="gemm:jit")
            if tag_name == "any":
                jit["any2"] = onednn_linear.Linear(w_kn, b, 1, impl="gemm:jit", parts=2)
        finally:
            onednn_linear.TAG_ANY = saved
    halves = w_nk.reshape(2, n // 2, k)  # (2, N/2, K)
    b2 = b.reshape(2, n // 2, 1)
    xcol = x.reshape(1, k, 1).expand(2, k, 1)
    cands = {
        "addmm_view(1t mkl)": lambda: torch.addmm(b, x, w_kn_view),
        "addmm_kn": lambda: torch.addmm(b, x, w_kn),
        "onednn_any": lambda: lin1(x),
        "onednn_parts2": lambda: lin2(x).reshape(1, n),
        "onednn_parts4": lambda: lin4(x).reshape(1, n),
        "onednn_parts8": lambda: lin8(x).reshape(1, n),
        **{
            f"gemmjit_{t}": (lambda lin: lambda: lin(x).reshape(1, n))(lin)
            for t, lin in jit.items()
        },
        "baddbmm_halves": lambda: torch.baddbmm(b2, halves, xcol).reshape(1, n),
        "mv": lambda: torch.addmv(b, w_nk, x.reshape(k)).reshape(1, n),
    }
    if args.only:
        cands = {name: fn for name, fn in cands.items() if name in args.only}
    for name, fn in cands.items():
        err = (fn().double() - want).abs().max().item()
        print(f"{name}: max err {err:.2e}")
    flush = np.ones(args.flush_mb << 18, dtype=np.float32)
    times = {name: [] for name in cands}
    warm = {name: [] for name in cands}
    for _ in range(args.calls):
        for name, fn in cands.items():
            flush.sum() if args.read_flush else flush.__iadd__(1.0)
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
            t = time.perf_counter()
            fn()
            warm[name].append(time.perf_counter() - t)
    for name in cands:
        c, w = np.array(times[name]) * 1e6, np.array(warm[name]) * 1e6
        print(f"{name:22s} cold min {c.min():7.1f} med {np.median(c):7.1f} us   "
              f"warm min {w.min():6.1f} med {np.median(w):6.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
