"""GPT-2's products on oneDNN's matmul (`onednn_linear.Linear`), variants of one product
alternating in one process (helper gpt16): QKV as 3 parts (main) against one 2304-column
product; each product at its row count against two row halves (what a forced M split does
for the work, run one after the other on the team).

    PYTHONPATH=. python benchmarks/gpt16_gemm_probe.py --threads 2 --rounds 9 --calls 20

1 thread: thread CPU time; 2: wall time. Prints us a call, the median of rounds (each round
the best of `--calls`)."""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from pygraphx.targets.torch_lowering.onednn_linear import Linear


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rows", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    g = torch.Generator().manual_seed(0)
    m = a.rows
    x768 = torch.randn(m, 768, generator=g)
    x3072 = torch.randn(m, 3072, generator=g)
    w_qkv = torch.randn(768, 2304, generator=g) * 0.03
    b_qkv = torch.randn(2304, generator=g)
    w_up = torch.randn(768, 3072, generator=g) * 0.03
    w_dn = torch.randn(3072, 768, generator=g) * 0.03
    w_pr = torch.randn(768, 768, generator=g) * 0.03
    w_lm = torch.randn(768, 50257, generator=g) * 0.03
    r = torch.randn(m, 768, generator=g)
    parts = Linear(w_qkv, b_qkv, m, parts=3)
    plain = Linear(w_qkv, b_qkv, m)
    up = Linear(w_up, torch.zeros(3072), m, epilogue="gelu_tanh")
    up_plain = Linear(w_up, torch.zeros(3072), m)
    dn = Linear(w_dn, torch.zeros(768), m, residual="sum")
    pr = Linear(w_pr, torch.zeros(768), m, residual="sum")
    lm = Linear(w_lm, None, m)
    half = m // 2
    up_h = Linear(w_up, torch.zeros(3072), half, epilogue="gelu_tanh")
    qkv_h = Linear(w_qkv, b_qkv, half)
    ref = parts(x768)
    assert torch.allclose(ref, plain(x768).reshape(m, 3, 768).permute(1, 0, 2), atol=1e-4)
    variants = {
        "qkv parts=3": lambda: parts(x768),
        "qkv plain 2304": lambda: plain(x768),
        "qkv 2 row halves": lambda: (qkv_h(x768[:half]), qkv_h(x768[half:])),
        "up gelu_tanh": lambda: up(x768),
        "up plain": lambda: up_plain(x768),
        "up gelu 2 row halves": lambda: (up_h(x768[:half]), up_h(x768[half:])),
        "down +sum": lambda: dn.into(x3072, r),
        "proj +sum": lambda: pr.into(x768, r),
        "lm head": lambda: lm(x768),
    }
    flops = {"qkv": 2 * m * 768 * 2304, "up": 2 * m * 768 * 3072, "down": 2 * m * 3072 * 768,
             "proj": 2 * m * 768 * 768, "lm": 2 * m * 768 * 50257}
    found: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for fn in variants.values():
        fn()
    for rnd in range(a.rounds):
        for k in names[:: 1 if rnd % 2 == 0 else -1]:
            best = float("inf")
            for _ in range(a.calls if k != "lm head" else max(3, a.calls // 5)):
                t = clock()
                variants[k]()
                best = min(best, clock() - t)
            found[k].append(best)
    print(f"# {a.threads} thread(s), rows {m}, loadavg {open('/proc/loadavg').read().split()[:3]}")
    for k, v in found.items():
        us = float(np.median(v)) * 1e6
        gf = flops[k.split()[0]] / us / 1e3
        print(f"{k:24s} {us:9.1f} us  {gf:6.1f} GFLOP/s")


if __name__ == "__main__":
    main()
