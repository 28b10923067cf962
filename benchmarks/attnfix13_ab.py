"""A/B in one process: the native attention kernel with its scratch thread-local (A: main's
kernel before attnfix13, built from git's `BASE` revision of `attention.c`) against the caller's
scratch (B: this tree's kernel, the plan's shared `Scratch`), bf16 and float32.

    PYTHONPATH=. python benchmarks/attnfix13_ab.py --threads 1 --rounds 9 --calls 20

The same operands as `attn13_ab.py blocks` (BERT-base / MiniLM / ViT-B/16 blocks, strided head
views of a fused QKV product, batch 1 and 8). Old and new kernels read the same parameter array
(the new one adds two fields at its end, which the old one does not read). Each round times
`--calls` calls of each (A B in even rounds, B A in odd ones); printed: the median over rounds
of the time per call (thread CPU time at one thread, wall at more) and whether A and B agree
bitwise.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401
import torch  # noqa: E402

from benchmarks.attn13_ab import SHAPES, operands  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.torch_lowering import native_attention as na  # noqa: E402

BASE = "3a69082"
SOURCE = "pygraphx/targets/native/kernels/attention.c"


def old_kernels() -> dict:
    src = subprocess.run(["git", "show", f"{BASE}:{SOURCE}"], check=True, capture_output=True,
                         text=True).stdout  # fmt: skip
    lib = native.load_source("attention_before_attnfix13", src)
    out = {}
    for dt, name in na._FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype = na.c_int
        fn.argtypes = [na.c_void_p, na.c_double] + [na.c_void_p] * 5
        out[dt] = fn
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    old = old_kernels()
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"{args.threads} thread(s), {args.rounds} rounds of {args.calls} calls, "
          f"{'thread CPU' if args.threads == 1 else 'wall'} us per call, median: "
          "A (thread-local scratch) / B (caller's scratch)")  # fmt: skip
    for dtype in (torch.bfloat16, torch.float32):
        for name in args.shapes:
            h, d, s, masked = SHAPES[name]
            for b in args.batches:
                q, kt, v, mask = (None if x is None else x.to(dtype) if x.dtype == torch.bfloat16
                                  else x for x in operands(b, h, d, s, masked))  # fmt: skip
                scale = d**-0.5
                new = na.Plan(na.kernel(dtype), scale, q, kt, v, mask, args.threads)
                before = na.Plan(na.kernel(dtype), scale, q, kt, v, mask, args.threads)
                before.fn = old[dtype]
                fns = {"A": before.run, "B": new.run}
                same = torch.equal(fns["A"](q, kt, v, mask), fns["B"](q, kt, v, mask))
                times: dict[str, list[float]] = {"A": [], "B": []}
                for r in range(args.rounds):
                    for n in ("A", "B") if r % 2 == 0 else ("B", "A"):
                        t0 = clock()
                        for _ in range(args.calls):
                            fns[n](q, kt, v, mask)
                        times[n].append((clock() - t0) / args.calls * 1e6)
                a, bb = statistics.median(times["A"]), statistics.median(times["B"])
                print(f"{str(dtype)[6:]:9s} {name:10s} b{b}: A {a:8.1f}  B {bb:8.1f}  "
                      f"B/A {bb / a:.3f}  bitwise same: {same}")


if __name__ == "__main__":
    main()
