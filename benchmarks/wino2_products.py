"""The Winograd kernel's batched products alone: this tree's `onednn_bmm.BatchedMatmul`
against a git revision's (default `main`), on the (points, C, K) weights and tile counts of
ResNet-50's 3x3 layers, in one process.

    python benchmarks/wino2_products.py --threads 1 2

Each call is timed warm (a loop) and cold (after a 64 MiB write: the weight comes from
memory, as in a network); best quarter of 20 calls; thread CPU time at one thread, else wall.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401,I001  (first: pygraphx sets OpenMP's spin count before torch)
import torch  # noqa: E402

from benchmarks.wino2_ab import load_revision  # noqa: E402
from pygraphx.targets.torch_lowering.malloc_keep import keep_freed_memory  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_bmm import BatchedMatmul  # noqa: E402

#: (C, K, rows): ResNet-50's layers at batch 1 (56x56: 196 tiles ... 7x7: 4) and batch 8
SHAPES = [(64, 64, 196), (128, 128, 49), (256, 256, 16), (512, 512, 4),
          (256, 256, 128), (512, 512, 32)]  # fmt: skip


def ms(fn, flush: torch.Tensor | None, calls: int = 20) -> float:
    """The best quarter's slowest call of `fn`, in ms (after a write of `flush` if given)."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    times = []
    for _ in range(calls + 3):
        if flush is not None:
            flush.fill_(1.0)
        start = clock()
        fn()
        times.append(clock() - start)
    times = sorted(times[3:])
    return times[len(times) // 4] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", nargs="+", type=int, default=[1])
    ap.add_argument("--ref", default="main", help="the git revision to compare with")
    args = ap.parse_args()
    keep_freed_memory()
    load_revision(args.ref)
    old_bmm = sys.modules["_rev_onednn_bmm"]
    flush = torch.empty((64 << 20) // 4)
    print("| threads | C, K, rows | weight MB | old warm | new warm | old cold | new cold |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for c, k, rows in SHAPES:
            weight = torch.randn(36, c, k)
            src = torch.randn(36, rows, c)
            old, new = old_bmm.BatchedMatmul(weight), BatchedMatmul(weight)
            torch.testing.assert_close(new(src), old(src), rtol=1e-4, atol=1e-4)
            cells = [ms(lambda f=f, s=src: f(s), fl) for fl in (None, flush) for f in (old, new)]
            text = " | ".join(f"{t:.3f}" for t in cells)
            print(f"| {threads} | {c}, {k}, {rows} | {weight.numel() * 4e-6:.1f} | {text} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
