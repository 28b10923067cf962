"""The last steps of a CNN (global pool, classifier) split into oneDNN's call and the rest of
the step, A/B of programs compiled under different settings, in one process, alternating runs.

    python benchmarks/tail12_overhead_ab.py --model mobilenetv2 --threads 2 --runs 300 \\
        --variant old:@gemm_kernels.LEAN_CLASSIFIER=False --variant lean: [--clock thread]

Each step of the fast path is timed as `targets.cpu.profile.time_steps` does, and every oneDNN
pooling / matmul execute inside it separately (same clock), so a step's time less its oneDNN
calls is its Python and torch overhead. `--clock thread`: the calling thread's CPU time (robust
to load; at 2 threads oneDNN's share on the other thread is not in it), `wall`: perf_counter.
Variants as in `mnv2b1_ab.py` (`NAME:VAR=VALUE,...`, `@module.NAME=literal`). Printed per
variant: each pooling / product step's min / median, its oneDNN call's min / median, and the
overhead (step less calls) min / median, in us; and the run's summed steps.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401
from benchmarks.mnv2b1_ab import compiled, parse_variant  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402


#: the steps reported: each runs exactly one oneDNN pooling or matmul call here
OPS = {"pooling", "dot"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--clock", choices=("thread", "wall"), default="thread")
    p.add_argument("--variant", action="append", required=True)
    args = p.parse_args()
    from pygraphx.targets.cpu.profile import time_steps
    from pygraphx.targets.torch_lowering import onednn_linear, onednn_pool

    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    calls: list[float] = []
    for cls in (onednn_linear._Primitive, onednn_pool.Primitive):
        def timed(self, x, y, _orig=cls.execute) -> None:  # noqa: ANN001
            t = clock()
            _orig(self, x, y)
            calls.append(clock() - t)

        cls.execute = timed
    model = get_model(args.model)
    feeds = model_inputs(args.model, model)
    variants = map(parse_variant, args.variant)
    progs = {name: compiled(model, args.threads, env) for name, env in variants}
    rows = {name: {"step": [], "call": [], "sum": []} for name in progs}
    for _ in range(5):
        for prog in progs.values():
            time_steps(prog._executable, feeds, 1, clock)
    for r in range(args.runs):
        order = list(progs) if r % 2 == 0 else list(progs)[::-1]
        for name in order:
            calls.clear()
            steps = time_steps(progs[name]._executable, feeds, 1, clock)
            # the pooling and product steps, each with its one oneDNN call (in run order)
            mine = [s.seconds for s in steps if {i.op.name for i in s.instructions} & OPS]
            assert len(mine) == len(calls), (len(mine), len(calls))
            rows[name]["step"].append(mine)
            rows[name]["sum"].append(sum(s.seconds for s in steps))
            rows[name]["call"].append(list(calls))
    for name, row in rows.items():
        step, call = np.array(row["step"]) * 1e6, np.array(row["call"]) * 1e6
        over = step - call
        fmt = lambda a: [f"{x:.1f}" for x in a]  # noqa: E731
        print(name, f"steps min {fmt(step.min(0))} med {fmt(np.median(step, 0))}",
              f"| calls min {fmt(call.min(0))} med {fmt(np.median(call, 0))}",
              f"| overhead min {fmt(over.min(0))} med {fmt(np.median(over, 0))}",
              f"| run sum med {np.median(row['sum']) * 1e3:.3f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
