"""Each lowered step of MobileNetV2 timed alone, for several variants in one process (helper
mnv18): where a bf16 (or float32) b1 run's time goes, old against new.

    PGX_CPU_LOAD_ADAPT=0 PGX_CPU_STALL_ADAPT=0 PYTHONPATH=. python benchmarks/mnv18_steps.py \
        --threads 1 --batch 1 --runs 200 [--f32] \
        --variant base:PGX_CPU_NATIVE_MBSTEM_BF16=0,PGX_CPU_NATIVE_MBHEAD_BF16=0 --variant new:

`--runs` profiled runs of each program, alternating run by run (`profile.time_steps`: a
chain's members each timed as the chain runs them, with its time stamps); each lowered step's
median and minimum (thread CPU time at 1 thread, wall at 2), the chain each runs in, and a plain
run's median on the same clock.
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


def label(step) -> str:  # noqa: ANN001
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
    p.add_argument("--f32", action="store_true", help="the float32 program (default bf16)")
    p.add_argument("--variant", action="append", required=True, help="NAME:K=V,K=V")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    case = load(f"mobilenetv2:{args.batch}")
    progs = {}
    for spec in args.variant:
        name, _, rest = spec.partition(":")
        env = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
        progs[name] = compile_variant(case, args.threads, Variant(name, env, bf16=not args.f32))
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
    print(f"# mobilenetv2 b{args.batch} {'f32' if args.f32 else 'bf16'} t{args.threads}, "
          f"{args.runs} runs, {'thread CPU' if args.threads == 1 else 'wall'} us; "
          f"loadavg {loadavg()}")
    for n in names:
        ex = progs[n]._executable
        steps = ex.lowered.steps
        print(f"{n}: {len(steps)} lowered steps, {len(ex.executor.steps)} run steps; a plain run "
              f"median {statistics.median(total[n]) * 1e6:.1f} us (min {min(total[n]) * 1e6:.1f})")
        acc = 0.0
        group = []
        for j, chain in enumerate(ex.chained.chains):
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
