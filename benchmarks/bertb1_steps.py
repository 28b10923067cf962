"""One `cpu` program's run against the sum of its steps: where a run's wall time goes.

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/bertb1_steps.py --threads 2

Plain runs and step-by-step runs alternate (`--runs` of each); printed: the median wall ms of a
plain run, of an instrumented one, the sum of each step's median and of each step's fastest
time, the median per-run time inside steps (the rest is binding inputs, the executor loop and
the outputs), then the same per block (`cpu_transformer_blocks.pgx_block`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cpu_transformer_blocks as ctb  # noqa: E402
from bertb1_profile import model_arguments  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model_arguments(ap, runs=12)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    prog = ctb.compile_pgx(model.SerializeToString(), args)
    exe = prog._executable
    steps = exe.lowered.steps
    for _ in range(2):
        prog.run(feeds)
    times = np.zeros((args.runs, len(steps)))
    plain, whole = [], []
    for r in range(args.runs):
        start = time.perf_counter()
        prog.run(feeds)
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        exe.executor.bind(feeds)
        with exe.scope():
            for i, fn in enumerate(exe.executor.steps):
                t0 = time.perf_counter()
                fn()
                times[r, i] = time.perf_counter() - t0
        exe.executor.collect()
        whole.append(time.perf_counter() - start)
    ms = 1e3
    print(f"{args.model} b{args.batch} {'bf16' if args.bf16 else 'float32'} {args.threads} "
          f"thread(s), {len(steps)} steps: plain run {np.median(plain) * ms:.1f} ms, instrumented "
          f"{np.median(whole) * ms:.1f}, steps' medians {np.median(times, 0).sum() * ms:.1f}, "
          f"steps' fastest {times.min(0).sum() * ms:.1f}, in steps per run "
          f"{np.median(times.sum(1)) * ms:.1f}")  # fmt: skip
    blocks = [ctb.pgx_block(s) for s in steps]
    for b in sorted(set(blocks)):
        idx = [i for i, x in enumerate(blocks) if x == b]
        print(f"  {b:10s} median {np.median(times[:, idx], 0).sum() * ms:.2f}, fastest "
              f"{times[:, idx].min(0).sum() * ms:.2f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
