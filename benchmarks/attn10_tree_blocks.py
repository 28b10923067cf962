"""Two source trees of pygraphx, A/B per block: each step's time in plain runs, fresh processes
alternating (a branch against main).

    PYTHONPATH=. python benchmarks/attn10_tree_blocks.py --base /work/main --model bert_base \
        --threads 1 --rounds 4 --runs 10

A whole run's CPU time moves by a few ms with the load of a shared machine, more than a change
to the attention or layer-norm steps; the sums of those steps' own times (thread CPU time at
one thread, wall otherwise; each step timed inside a normal run, releases and all) move less.
Each process imports pygraphx from its tree (`PYTHONPATH`), compiles the model on the `cpu`
target and runs it `--runs` times; printed: per process the medians over its runs of each
block's sum and of the run (ms), then per tree the median over its processes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: the child: block sums of each run (pygraphx from its tree, the benchmark helpers from this one)
CHILD = r"""
import json, sys, time
import numpy as np
import pygraphx  # first, from the cwd (its tree): the helpers below then use this one
sys.path.insert(0, sys.argv[4])  # this tree's benchmarks
import cpu_transformer_blocks as ctb
from attn10_ab import compile_b, model_and_feeds, timed_run

model_name, threads, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
clock = time.thread_time_ns if threads == 1 else time.perf_counter_ns
data, feeds = model_and_feeds(model_name, threads)
prog = compile_b(data, threads)
blocks = [ctb.pgx_block(s) for s in prog._executable.lowered.steps]
for _ in range(2):
    prog.run(feeds)
sums = {b: [] for b in set(blocks)}
whole = []
for _ in range(runs):
    t, run, _ = timed_run(prog, feeds, clock)
    whole.append(run / 1e6)
    for b in sums:
        sums[b].append(sum(x for x, y in zip(t, blocks) if y == b) / 1e6)
out = {b: float(np.median(v)) for b, v in sums.items()}
out["run"] = float(np.median(whole))
out["tree"] = pygraphx.__file__
print(json.dumps(out))
"""


def one(root: Path, model: str, threads: int, runs: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), "PGX_CPU_LOAD_ADAPT": "0"}
    cmd = [sys.executable, "-c", CHILD, model, str(threads), str(runs), str(ROOT / "benchmarks")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=root)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="the other tree (A)")
    ap.add_argument("--model", default="bert_base")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args(argv)
    trees = {"A base": args.base.resolve(), "B this": ROOT}
    rows: dict[str, list[dict]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name in list(trees) if r % 2 == 0 else list(trees)[::-1]:
            got = one(trees[name], args.model, args.threads, args.runs)
            rows[name].append(got)
            tree = got.pop("tree")
            print(name, tree, json.dumps({k: round(v, 3) for k, v in sorted(got.items())}),
                  flush=True)  # fmt: skip
    keys = sorted(rows["A base"][0])
    print(f"{args.model} b1 t{args.threads}, median over {args.rounds} processes of each one's "
          f"median over {args.runs} runs (ms): block A / B")  # fmt: skip
    for k in keys:
        a, b = (float(np.median([x[k] for x in rows[n]])) for n in trees)
        print(f"  {k:10s} {a:8.2f} / {b:8.2f}  ({b - a:+.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
