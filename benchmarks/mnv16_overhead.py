"""Where a MobileNetV2 run's time outside its steps goes (mnv16): the run's pieces timed in
place, by perf_counter stamps around each (bind, the run scope's enter, the first step, the
other steps, the scope's exit, collect), over many runs; medians in us.

    python benchmarks/mnv16_overhead.py --threads 2 --batch 1 --rounds 6 --runs 100
        [--old K=V,...] [--new K=V,...] [--bf16]

The loop is `Executor.run`'s own (the same closures), unrolled with the stamps (each
perf_counter ~0.1-0.6 us). Two variants (`--old` / `--new`: the environment, or `@module.NAME`
patches, set while each compiles; by default old = `@cpu.scheduling.SKIP_SAME_COUNT=False`),
in one process, alternating blocks of `--runs` runs (the order reversed every round); each
piece's median over all runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnv2b1_ab import compiled  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402


def pieces(prog: object, feeds: dict, runs: int) -> dict[str, float]:
    ex = prog._executable.executor
    bind, collect, scope, steps = ex.bind, ex.collect, ex.context, ex.steps
    clock = time.perf_counter
    rows = []
    for _ in range(runs):
        t0 = clock()
        bind(feeds)
        t1 = clock()
        s = scope()
        s.__enter__()
        t2 = clock()
        steps[0]()
        t3 = clock()
        for st in steps[1:]:
            st()
        t4 = clock()
        s.__exit__(None, None, None)
        t5 = clock()
        collect()
        t6 = clock()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t6 - t0))
    a = np.median(np.array(rows), axis=0) * 1e6
    names = ["bind", "enter", "first_step", "other_steps", "exit", "collect", "total"]
    return {n: round(float(v), 1) for n, v in zip(names, a, strict=True)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--old", default="@cpu.scheduling.SKIP_SAME_COUNT=False")
    p.add_argument("--new", default="")
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = get_model("mobilenetv2", batch=args.batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs("mobilenetv2", model).items()}

    def env(text: str) -> dict[str, str]:
        return dict(kv.split("=", 1) for kv in text.split(",") if kv)

    progs = {n: compiled(model, args.threads, env(v), bf16=args.bf16)
             for n, v in (("old", args.old), ("new", args.new))}  # fmt: skip
    for prog in progs.values():
        for _ in range(20):
            prog.run(feeds)
    load = Path("/proc/loadavg").read_text().split()[0]
    rows: dict[str, list[dict[str, float]]] = {n: [] for n in progs}
    order = list(progs.items())
    for r in range(args.rounds):
        for name, prog in order if r % 2 == 0 else order[::-1]:
            rows[name].append(pieces(prog, feeds, args.runs))
    print(f"threads {args.threads} batch {args.batch} rounds {args.rounds} x {args.runs} "
          f"old {args.old!r} new {args.new!r} bf16 {args.bf16} "
          f"steps {len(progs['new']._executable.executor.steps)} load {load} -> "
          f"{Path('/proc/loadavg').read_text().split()[0]}")  # fmt: skip
    for name, got in rows.items():
        print(name, {k: round(float(np.median([g[k] for g in got])), 1) for k in got[0]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
