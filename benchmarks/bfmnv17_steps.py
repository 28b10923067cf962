"""Each step of the bf16 MobileNetV2 program timed alone (helper bfmnv17): what the steps the
native chain leaves (input conversion, the stem, the 7x7 / head oneDNN chain, the pool, the
classifier) cost, for the old rule and for every block native (`bfmnv17_ab.OLD` / `NEW`).

    PGX_CPU_LOAD_ADAPT=0 PGX_CPU_STALL_ADAPT=0 PYTHONPATH=. python benchmarks/bfmnv17_steps.py \
        --threads 1 --batch 1 --runs 200 [--variants old new]

Both programs compiled in one process; `--runs` profiled runs of each, alternating run by run;
each lowered step's median and minimum (thread CPU time at 1 thread, wall at 2;
`profile.time_steps`: a chain's members each timed, run one by one where the chain is native);
which steps the run executes as one (`executor.steps`: chains) said; the total of a plain run
(median, same clock) beside the sum of the steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ab_harness import Variant, compile_variant, load, loadavg  # noqa: E402
from pygraphx.targets.cpu.profile import time_steps  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bfmnv17_ab import NEW, OLD  # noqa: E402


def label(step) -> str:  # noqa: ANN001
    """The step's instructions (op names, counted) and its last output's shape."""
    names: dict[str, int] = {}
    for ins in step.instructions:
        names[ins.op.name] = names.get(ins.op.name, 0) + 1
    last = step.instructions[-1]
    what = " ".join(f"{k}x{v}" if v > 1 else k for k, v in names.items())
    return f"{what} -> {list(last.shape.lens())} {last.shape.type_string()}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--variants", nargs="+", default=["old", "new"])
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    case = load(f"mobilenetv2:{args.batch}")
    envs = {"old": OLD, "new": NEW}
    progs = {n: compile_variant(case, args.threads, Variant(n, envs[n], bf16=True))
             for n in args.variants}  # fmt: skip
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    for pr in progs.values():
        for _ in range(5):
            pr.run(case.feeds)
    per = {n: [] for n in progs}
    total = {n: [] for n in progs}
    names = list(progs)
    for r in range(args.runs):
        for n in names if r % 2 == 0 else names[::-1]:
            per[n].append([t.seconds for t in time_steps(progs[n]._executable, case.feeds, 1,
                                                         clock)])
            t0 = clock()
            progs[n].run(case.feeds)
            total[n].append(clock() - t0)
    print(f"# mobilenetv2 b{args.batch} bf16 t{args.threads}, {args.runs} runs, "
          f"{'thread CPU' if args.threads == 1 else 'wall'} us; loadavg {loadavg()}")
    for n in names:
        steps = progs[n]._executable.lowered.steps
        print(f"{n}: {len(steps)} lowered steps, {len(progs[n]._executable.executor.steps)} "
              f"run steps; a plain run median "
              f"{statistics.median(total[n]) * 1e6:.1f} us")
        acc = 0.0
        group = []  # each lowered step's run step: its index and kind
        for j, chain in enumerate(progs[n]._executable.chained.chains):
            size = 1 if chain is None else len(chain.seconds)
            kind = "" if chain is None else type(chain).__name__
            group += [f"[{j}{' ' + kind if kind else ''}]"] * size
        for i, st in enumerate(steps):
            col = [run[i] for run in per[n]]
            med = statistics.median(col) * 1e6
            acc += med
            print(f"  {i:2d} {group[i]:12s} {med:8.1f} (min {min(col) * 1e6:8.1f})  {label(st)}")
        print(f"  sum of medians {acc:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
