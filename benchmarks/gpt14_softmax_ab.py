"""A/B in one process: the native attention kernel's block softmax, both passes row by row (A,
the build flag `-DPGX_ATTN_ROWWISE=1`, the version before) against every row's first pass then
every row's second (B, the default build).

    PYTHONPATH=. python benchmarks/gpt14_softmax_ab.py --threads 1 --rounds 15

Blocks (h 12, Q / K / V strided head views of one fused product): GPT-2's causal one (s 128,
d 64; `attend_causal`) at batch 1 and 8, BERT-base's (s 128, d 64, padding mask), MiniLM's
(s 128, d 32, padding mask) and ViT-B/16's (s 197, d 64, no mask) at batch 1; bf16 and
float32. Each round times `--calls` calls of each (A B in even rounds, B A in odd); printed: the
median time per call (thread CPU at one thread, wall at more), B/A and the A vs B max
difference (0 expected: the same arithmetic in another order of rows).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: its tree wins

import pygraphx  # noqa: E402,F401  (before torch: it sets OpenMP's spin count)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.attn13_ab import operands  # noqa: E402
from pygraphx.targets.torch_lowering import native_attention as na  # noqa: E402

BLOCKS = (  # name, batch, (h, d, s), mask: "causal", "padding" or None
    ("gpt2", 1, (12, 64, 128), "causal"),
    ("gpt2", 8, (12, 64, 128), "causal"),
    ("bert_base", 1, (12, 64, 128), "padding"),
    ("minilm", 1, (12, 32, 128), "padding"),
    ("vit_b16", 1, (12, 64, 197), None),
)


def block_fn(dtype: torch.dtype, kind: str | None, scale: float, ops: tuple):
    q, kt, v, mask = ops
    if kind == "causal":
        run = na.attend_causal(scale, {}, dtype, 0)
        return lambda: run(q, kt, v)
    full = na.attend(scale, {}, None, dtype)
    return lambda: full(q, kt, v, mask)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"{args.threads} thread(s), {args.rounds} rounds of {args.calls} calls, "
          f"{'thread CPU' if args.threads == 1 else 'wall'} us per call, median: A (rows one by "
          "one) / B (first passes, then second passes)")  # fmt: skip
    for dtype in (torch.bfloat16, torch.float32):
        kernels = {"A": na.kernel(dtype, ("-DPGX_ATTN_ROWWISE=1",)), "B": na.kernel(dtype)}
        for name, b, (h, d, s), kind in BLOCKS:
            q, kt, v, mask = operands(b, h, d, s, kind == "padding")
            ops = (q.to(dtype), kt.to(dtype), v.to(dtype), mask)
            fns = {}
            for n, fn in kernels.items():
                na._kernels[dtype] = fn  # the variant the next plan binds
                fns[n] = block_fn(dtype, kind, d**-0.5, ops)
                fns[n]()
            na._kernels[dtype] = kernels["B"]
            diff = float((fns["A"]().float() - fns["B"]().float()).abs().max())
            times: dict[str, list[float]] = {"A": [], "B": []}
            for r in range(args.rounds):
                for n in ("A", "B") if r % 2 == 0 else ("B", "A"):
                    start = clock()
                    for _ in range(args.calls):
                        fns[n]()
                    times[n].append((clock() - start) / args.calls)
            a, bb = (float(np.median(times[n])) * 1e6 for n in "AB")
            print(f"  {str(dtype)[6:]:8s} {name:9s} b{b} {kind or 'no mask':8s}: {a:8.1f} / "
                  f"{bb:8.1f} us (B/A {bb / a:.3f}); max diff {diff:.1e}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
