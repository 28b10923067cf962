"""Per-call cost of GELU (erf form) on BERT-base's FFN-up product, one thread, thread CPU time
(helper gelu16): oneDNN's matmul primitive (C API, `onednn_linear.Linear`) with and without its
gelu_erf post-op, and the native passes (`native_gelu.GeluErf`, and the tanh pass for scale)
over the (rows, 3072) result. Blocks alternate, the order reversed each round.

    PYTHONPATH=. python benchmarks/gelu16_kernel.py --rows 128 --rounds 15 [--bf16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pygraphx.targets.torch_lowering import native_gelu, onednn_linear


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--k", type=int, default=768)
    ap.add_argument("--n", type=int, default=3072)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--std", type=float, default=0.55, help="the product's spread (BERT-base "
                    "random weights: 0.55; MiniLM: ~1.5 about -0.7)")  # fmt: skip
    ap.add_argument("--mean", type=float, default=0.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dt = torch.bfloat16 if args.bf16 else torch.float32
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.rows, args.k, generator=g).to(dt)
    w = (torch.randn(args.k, args.n, generator=g) * args.std / args.k**0.5).to(dt)
    b = torch.full((args.n,), args.mean).to(dt)
    plain = onednn_linear.Linear(w, b, args.rows)
    fused = onednn_linear.Linear(w, b, args.rows, epilogue="gelu")
    erf, tanh = native_gelu.GeluErf(), native_gelu.GeluTanh()
    wide = onednn_linear.Linear(w, b, args.rows, out_dtype=torch.float32, twin=plain)
    to_bf16 = native_gelu.GeluErfToBf16()
    y32 = plain(x).float().contiguous()
    work = y32.clone()
    cases = {
        "matmul": lambda: plain(x),
        "matmul+gelu_erf post-op": lambda: fused(x),
        "matmul, then native erf pass": (
            (lambda: to_bf16(wide(x))) if args.bf16 else (lambda: erf(plain(x)))
        ),
        "native erf pass": lambda: erf(work.copy_(y32)),
        "copy (the pass's reset)": lambda: work.copy_(y32),
        "native tanh pass": lambda: tanh(work.copy_(y32)),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            fn = cases[name]
            fn()
            t0 = time.thread_time_ns()
            for _ in range(args.calls):
                fn()
            times[name].append((time.thread_time_ns() - t0) / args.calls / 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.rows} x {args.k} x {args.n} {dt}, result ~ N({args.mean}, {args.std}^2), "
          f"1 thread, us a call (median of "
          f"{args.rounds} blocks of {args.calls}, thread CPU time)")
    for k, v in med.items():
        print(f"  {k:28s} {v:9.1f}  (min {min(times[k]):.1f})")
    copy = med["copy (the pass's reset)"]
    print(f"  new - old (matmul then pass - matmul with post-op): "
          f"{med['matmul, then native erf pass'] - med['matmul+gelu_erf post-op']:.1f}")
    print(f"  post-op cost {med['matmul+gelu_erf post-op'] - med['matmul']:.1f}; "
          f"erf pass {med['native erf pass'] - copy:.1f}; tanh pass "
          f"{med['native tanh pass'] - copy:.1f} (passes less the copy)")


if __name__ == "__main__":
    main()
