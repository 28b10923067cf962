"""Each step of a `cpu` program as the model runs it (cold) against at once again (warm).

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/attn10_steps_cold.py --threads 1

Every step of a run is timed, then run a second time at once and timed again: the first time
is what the run pays (the step's code and data out of the caches after the weight product
before it), the second what the step costs warm. A probe only: the outputs are not checked
(a step run twice recomputes its values from the same inputs; no value is released during the
run, so freed memory is not reused as in a plain run). Printed per block
(`cpu_transformer_blocks.pgx_block`): the medians over `--runs` runs of the blocks' cold and
warm sums, in ms a run (thread CPU time at one thread, wall time otherwise), and steps a run.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cpu_transformer_blocks as ctb  # noqa: E402
from attn10_ab import model_and_feeds  # noqa: E402
from bertb1_profile import model_arguments  # noqa: E402

RELEASE = "<pygraphx release>"


def unreleased(fn: Callable[[], None]) -> Callable[[], None]:
    """A step without its releases (`lower._with_release`): its inputs stay for the rerun."""
    while getattr(fn, "__code__", None) is not None and fn.__code__.co_filename == RELEASE:
        fn = fn.__closure__[fn.__code__.co_freevars.index("fn")].cell_contents
    return fn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model_arguments(ap, threads=1, runs=8)
    args = ap.parse_args(argv)
    clock = time.thread_time_ns if args.threads == 1 else time.perf_counter_ns
    data, feeds = model_and_feeds(args.model, args.threads, args.batch)
    prog = ctb.compile_pgx(data, args)
    exe = prog._executable
    steps = exe.lowered.steps
    for _ in range(2):
        prog.run(feeds)
    cold, warm = np.zeros((args.runs, len(steps))), np.zeros((args.runs, len(steps)))
    for r in range(args.runs):
        exe.executor.bind(feeds)
        with exe.scope():
            for i, fn in enumerate(unreleased(s.fn) for s in steps):
                t0 = clock()
                fn()
                t1 = clock()
                fn()
                t2 = clock()
                cold[r, i], warm[r, i] = t1 - t0, t2 - t1
        exe.executor.collect()
    ms = 1e-6
    blocks = [ctb.pgx_block(s) for s in steps]
    print(f"{args.model} b{args.batch} {'bf16' if args.bf16 else 'float32'} {args.threads} "
          f"thread(s), {len(steps)} steps, median of {args.runs} runs, ms a run: cold (as run) / "
          f"warm (again at once) / difference")  # fmt: skip
    for b in [*sorted(set(blocks)), "all"]:
        idx = [i for i, x in enumerate(blocks) if x == b or b == "all"]
        c, w = np.median(cold[:, idx].sum(1)) * ms, np.median(warm[:, idx].sum(1)) * ms
        print(f"  {b:10s} {len(idx):3d} steps: {c:8.2f} / {w:8.2f} / {c - w:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
