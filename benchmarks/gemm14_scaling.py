"""Per kind of step, one thread against two in one process (helper gemm14; `--bf16` and the
fastest-run column: gemm15): how well each kind of step scales.

    PYTHONPATH=. python benchmarks/gemm14_scaling.py --model bert_base:1 --bf16 --rounds 10

The model is compiled for one thread and for two (the cpu target sets each step's threads
itself); rounds alternate a profiled run of the first (each step's thread CPU time) and of the
second (each step's wall time); per kind the medians' sums and their ratio (2.0: perfect
scaling).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attn13_ab import load  # noqa: E402
from benchmarks.gemm14_ab import profiled  # noqa: E402
from benchmarks.gemm14_profile import KINDS, pgx_kind  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args(argv)
    import torch

    import pygraphx
    from pygraphx.targets.cpu.target import CpuTarget

    data, feeds = load(args.model)
    progs = {}
    for t in (1, 2):
        torch.set_num_threads(t)
        progs[t] = pygraphx.parse_onnx_buffer(data)
        if args.bf16:
            pygraphx.quantize_bf16(progs[t])
        progs[t].compile(CpuTarget(threads=t))
    times: dict[int, list[list[float]]] = {1: [], 2: []}
    walls: dict[int, list[float]] = {1: [], 2: []}
    for t in (1, 2):
        torch.set_num_threads(t)
        progs[t].run(feeds)
    for r in range(args.rounds):
        for t in (1, 2) if r % 2 == 0 else (2, 1):
            torch.set_num_threads(t)
            clock = time.thread_time if t == 1 else time.perf_counter
            start = clock()
            progs[t].run(feeds)
            walls[t].append(clock() - start)
            times[t].append(profiled(progs[t], feeds, clock))
    per, fast = {}, {}
    for t in (1, 2):
        steps = progs[t]._executable.lowered.steps
        for store, stat in ((per, np.median), (fast, np.min)):
            acc: dict[str, float] = defaultdict(float)
            for st, v in zip(steps, stat(np.array(times[t]), axis=0), strict=True):
                acc[pgx_kind(st)] += v
            store[t] = acc
    print(f"# {args.model}, loadavg {Path('/proc/loadavg').read_text().split()[:3]}; run median: "
          f"t1 {np.median(walls[1]) * 1e3:.2f} ms (thread CPU), t2 {np.median(walls[2]) * 1e3:.2f}"
          " ms (wall)")  # fmt: skip
    print("| kind | t1 (thread CPU ms) | t2 (wall ms) | t1 / t2 | t1 fastest | t2 fastest "
          "| ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for k in (*KINDS, "sum"):
        a, b, c, d = (
            sum(s[t].values()) if k == "sum" else s[t].get(k, 0.0)
            for s, t in ((per, 1), (per, 2), (fast, 1), (fast, 2))
        )
        if a or b:
            print(f"| {k} | {a * 1e3:.2f} | {b * 1e3:.2f} | {a / b if b else 0:.2f} | "
                  f"{c * 1e3:.2f} | {d * 1e3:.2f} | {c / d if d else 0:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
