"""Where a real GPT-2 run loses against the sum of its steps' fastest times (helper gpt17).

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/gpt17_gap.py --threads 2 --batch 1 \
        --runs 20 --alone 5 --wait-quiet 120

Rounds alternate a plain `prog.run` with an instrumented run (a `perf_counter` stamp before and
after every step, nothing else): per step its time inside real runs (median and fastest over the
runs), the time between steps (the loop, bind, collect), per group (QKV, attention, proj, FFN up,
FFN down, LM head, norms, other; `gpt16_profile`'s groups). `--alone N`: after the runs, each
step called N + 1 times in a row, a pass each round (its weights and inputs warm in the caches, the OpenMP
team just used), the fastest of the last N: the step's warm time alone. (Steps that accumulate in
place then compute over garbage: timing only; a fresh run follows.) The differences say what a run
pays beyond a step's warm time (`--pair`: each call right after the step before it, the
weights warm, its source as that step leaves it): the run-to-run spread (median against fastest in-run), cold
weights and team wake-up (fastest in-run against warm alone) and the loop between steps.
One thread: thread CPU time; more: wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bertb1_profile as bp  # noqa: E402
import cpu_transformer_blocks as ctb  # noqa: E402
import gemm14_profile as g14  # noqa: E402
import gemm15_ab as harness  # noqa: E402
import gpt16_profile as g16  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402


def unwrapped(fn: Any) -> Any:
    """The step `fn` without its releases (`lower._with_release`), a thread switch
    (`scheduling._switching`: its count is set once here) kept out."""
    from pygraphx.targets.cpu.scheduling import set_threads

    if hasattr(fn, "released"):
        return fn.released[0]
    free = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
    if {"count", "fn", "limit"} <= set(free):
        set_threads(min(free["count"], free["limit"][0]))
        return unwrapped(free["fn"])
    return fn


def alone_pass(prog: Any, feeds: dict, calls: int, pair: bool, clock: Any, best: Any) -> None:
    """One pass over the steps, each called `calls` + 1 times in a row (`pair`: each call right
    after the step before it), keeping each step's fastest of the last `calls` in `best`."""
    exe = prog._executable
    ex, steps = exe.executor, exe.executor.steps
    ex.bind(feeds)
    with exe.scope():
        for k, fn in enumerate(steps):
            bare = unwrapped(fn)
            prev = unwrapped(steps[k - 1]) if pair and k else None
            for i in range(calls + 1):
                if prev is not None:
                    prev()
                start = clock()
                bare()
                took = clock() - start
                if i:
                    best[k] = min(best[k], took)
            # the releases (of the step before with `pair`: its inputs are read again)
            if not pair:
                fn()
            elif k:
                steps[k - 1]()
        if pair:
            steps[-1]()
    ex.collect()
    prog.run(feeds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bp.model_arguments(ap, model="gpt2", threads=2, runs=20)
    ap.add_argument("--alone", type=int, default=0, help="calls of each step alone (0: none)")
    ap.add_argument("--pair", action="store_true", help="alone: each call right after the "
                    "step before it (its producer's data as in a run, the weights warm)")
    ap.add_argument("--wait-quiet", type=float, default=0.0)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    prog = ctb.compile_pgx(model.SerializeToString(), args)
    for _ in range(3):
        prog.run(feeds)
    exe = prog._executable
    ex = exe.executor
    steps = ex.steps
    groups = [g16.group_of(g14.pgx_kind(s)) for s in exe.lowered.steps]
    n = len(steps)
    if args.wait_quiet:
        print(harness.wait_quiet(args.wait_quiet), flush=True)
    plain: list[float] = []
    total: list[float] = []
    per = np.zeros((args.runs, n))
    between = np.zeros((args.runs, n + 1))  # [0]: bind; [k]: after step k-1; [n]: collect
    alone = np.full(n, np.inf if args.alone else np.nan)
    for r in range(args.runs):
        start = clock()
        out = prog.run(feeds)
        plain.append(clock() - start)
        del out
        stamps = np.zeros(2 * n + 2)
        stamps[0] = clock()
        ex.bind(feeds)
        with exe.scope():
            for k, fn in enumerate(steps):
                stamps[2 * k + 1] = clock()
                fn()
                stamps[2 * k + 2] = clock()
        ex.collect()
        stamps[-1] = clock()
        total.append(stamps[-1] - stamps[0])
        per[r] = stamps[2:-1:2] - stamps[1:-1:2]
        between[r] = stamps[1::2] - stamps[0::2]
        if args.alone:  # (a pass each round: the fastest over the rounds, as in-run)
            alone_pass(prog, feeds, args.alone, args.pair, clock, alone)
    what = "thread CPU" if args.threads == 1 else "wall"
    print(f"{args.model} b{args.batch} t{args.threads}, {args.runs} runs, {what} ms; loadavg "
          f"{Path('/proc/loadavg').read_text().split()[0]}")  # fmt: skip
    print(f"  prog.run median {np.median(plain) * 1e3:.2f} min {min(plain) * 1e3:.2f}; "
          f"instrumented median {np.median(total) * 1e3:.2f} min {min(total) * 1e3:.2f}")
    med, fast = np.median(per, axis=0), per.min(axis=0)
    gaps = np.median(between, axis=0)
    print(f"  steps: sum of medians {med.sum() * 1e3:.2f}, sum of fastest {fast.sum() * 1e3:.2f}"
          + (f", sum alone {np.nansum(alone) * 1e3:.2f}" if args.alone else "")
          + f"; between steps (median sums) {gaps.sum() * 1e3:.3f} (bind {gaps[0] * 1e3:.3f}, "
          f"collect {gaps[-1] * 1e3:.3f}, loop {gaps[1:-1].sum() * 1e3:.3f}: "
          f"{gaps[1:-1].mean() * 1e6:.2f} us a step)")
    # the run's spread: each run's steps' sum minus the fastest sum, per group
    by: dict[str, list[int]] = defaultdict(list)
    for k, g in enumerate(groups):
        by[g].append(k)
    print(f"  {'group':10s} {'steps':>5s} {'median':>9s} {'fastest':>9s} {'alone':>9s} "
          f"{'med-fast':>9s} {'fast-alone':>10s} {'p90':>9s}")
    for g in g16.GROUPS:
        ks = by.get(g)
        if not ks:
            continue
        sums = per[:, ks].sum(axis=1)
        a = np.nansum(alone[ks]) * 1e3 if args.alone else float("nan")
        print(f"  {g:10s} {len(ks):5d} {med[ks].sum() * 1e3:9.2f} {fast[ks].sum() * 1e3:9.2f} "
              f"{a:9.2f} {(med[ks].sum() - fast[ks].sum()) * 1e3:9.2f} "
              f"{fast[ks].sum() * 1e3 - a:10.2f} {np.percentile(sums, 90) * 1e3:9.2f}")
    # a product right after a step that is not a product (attention / norm): team wake-up?
    prod = {"qkv", "proj", "ffn_up", "ffn_down", "lm_head"}
    print("  products by what ran before them (median in-run / alone, us, mean over steps):")
    for g in sorted(prod):
        for before in sorted({groups[k - 1] for k in by.get(g, []) if k}):
            ks = [k for k in by[g] if k and groups[k - 1] == before]
            a = np.nanmean(alone[ks]) * 1e6 if args.alone else float("nan")
            print(f"    {g:8s} after {before:9s} x{len(ks):2d}: {med[ks].mean() * 1e6:9.1f} / "
                  f"{a:9.1f}  fastest {fast[ks].mean() * 1e6:9.1f}")
    worst = np.argsort(-(med - fast))[: args.top]
    print(f"  steps with the largest median - fastest (top {args.top}):")
    for k in worst:
        print(f"    #{k:3d} {groups[k]:9s} median {med[k] * 1e3:7.3f} fastest {fast[k] * 1e3:7.3f} "
              f"alone {alone[k] * 1e3:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
