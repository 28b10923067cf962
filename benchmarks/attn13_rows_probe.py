"""Probe: the native attention kernel's query rows per block (`ROWS` 16 / 32 / 64), one thread,
thread CPU us per call, median of 15 alternating rounds of 10 calls (results/attn13.md).

    PYTHONPATH=. python benchmarks/attn13_rows_probe.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import pygraphx  # noqa: F401  (before torch: it sets OpenMP's spin count)
import torch

from pygraphx.targets.torch_lowering import native_attention as na

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attn13_ab import operands  # noqa: E402

SHAPES = {"bert b1": (1, 12, 64, 128, 1), "bert b8": (8, 12, 64, 128, 1),
          "minilm b8": (8, 12, 32, 128, 1), "vit b1": (1, 12, 64, 197, 0)}  # fmt: skip


def main() -> int:
    torch.set_num_threads(1)
    for name, (b, h, d, s, m) in SHAPES.items():
        q, kt, v, mask = operands(b, h, d, s, bool(m))
        plans = {}
        for rows in (16, 32, 64):
            na.ROWS = rows
            plans[rows] = na.Plan(na.kernel(q.dtype), d**-0.5, q, kt, v, mask, 1)
        times: dict[int, list[float]] = {n: [] for n in plans}
        for r in range(15):
            for n in list(plans) if r % 2 == 0 else list(plans)[::-1]:
                t0 = time.thread_time()
                for _ in range(10):
                    plans[n].run(q, kt, v, mask)
                times[n].append((time.thread_time() - t0) / 10)
        print(name, {n: round(statistics.median(x) * 1e6) for n, x in times.items()}, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
