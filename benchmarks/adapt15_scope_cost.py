"""What the stall adaptation costs a run: `RunScope` entered and left with and without its
`StallAdapt`, no steps in between, in alternating blocks (both orders), thread CPU time per run.

    PGX_CPU_LOAD_ADAPT=0 python benchmarks/adapt15_scope_cost.py --threads 2 --rounds 6

The scope keeps its full count throughout (every "run" takes the same time, so no stall is
seen): this is the price of the feedback on a quiet machine, two `perf_counter` calls and
the controller's bookkeeping under its lock.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402, F401  (before torch)
from pygraphx.targets.cpu.scheduling import RunScope  # noqa: E402


def block(scope: RunScope, runs: int) -> float:
    start = time.thread_time()
    for _ in range(runs):
        with scope():
            pass
    return (time.thread_time() - start) / runs * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    scopes = {"on": RunScope(args.threads, stall=True), "off": RunScope(args.threads, stall=False)}
    for s in scopes.values():
        block(s, 2000)
    got: dict[str, list[float]] = {k: [] for k in scopes}
    for r in range(args.rounds):
        for k in (("on", "off") if r % 2 == 0 else ("off", "on")):
            got[k].append(block(scopes[k], args.runs))
    for k, v in got.items():
        print(f"{k:3s}: {statistics.median(v):6.2f} us CPU a run (blocks: "
              + " ".join(f"{x:.2f}" for x in v) + ")")  # fmt: skip
    diff = [a - b for a, b in zip(got["on"], got["off"], strict=True)]
    print(f"on - off: median {statistics.median(diff):+.2f} us a run; "
          f"stall count {scopes['on'].stall.count} of {args.threads}, "
          f"changes {scopes['on'].stall.changes}")  # fmt: skip


if __name__ == "__main__":
    main()
