"""A/B of two source trees of pygraphx on one model: alternating child processes, both orders.

    python benchmarks/chain11_trees_ab.py --base-rev main --model mobilenetv2 --threads 2

The base revision (`--base-rev`, extracted with `git archive` into a temporary folder) and
this tree each compile the model in a fresh child process per block and time `--runs` runs
after a warm-up: wall ms and process CPU ms a run (the spinning workers included), and the
median over the runs of each run's time outside its steps (`Program.run` less the
executor's step loop, us: "outside" wall, "outside_thread_cpu" the calling thread's CPU time,
which a preemption does not inflate). Printed per tree: the median over the blocks. Compare only
within one invocation (one machine, one moment); on a shared machine repeat it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> None:
    """Compile and time in this process (run with PYTHONPATH set to the tree)."""
    import pygraphx
    from pygraphx.models import get_model, model_inputs

    model = get_model(args.model, batch=args.batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs(args.model, model).items()}
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu", threads=args.threads))
    exe = prog._executable
    steps, loops, loops_cpu = exe.executor.steps, [], []
    clock, tclock = time.perf_counter, time.thread_time

    class Steps:  # the step loop, timed (the executor iterates over it once a run)
        def __iter__(self):  # noqa: ANN204
            start, tstart = clock(), tclock()
            yield from steps
            loops.append(clock() - start)
            loops_cpu.append(tclock() - tstart)

    for _ in range(10):
        prog.run(feeds)
    exe.executor.steps = Steps()
    loops.clear()
    loops_cpu.clear()
    walls, tcpu = [], []
    cpu = time.process_time()
    for _ in range(args.runs):
        start, tstart = clock(), tclock()
        prog.run(feeds)
        walls.append(clock() - start)
        tcpu.append(tclock() - tstart)
    cpu = (time.process_time() - cpu) / args.runs
    outside = np.median(np.array(walls) - np.array(loops))
    outside_cpu = np.median(np.array(tcpu) - np.array(loops_cpu))
    out = np.array(prog.run(feeds)[0])
    wall = 1e3 * float(np.median(walls))
    row = {"wall_ms": wall, "cpu_ms": 1e3 * cpu, "outside_us": 1e6 * float(outside),
           "outside_thread_cpu_us": 1e6 * float(outside_cpu)}  # fmt: skip
    print(json.dumps({**row, "out_sum": float(out.sum())}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenetv2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--base-rev", default="main")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory() as base:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base_rev],
                                 check=True, capture_output=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        trees = [(args.base_rev, base), ("this tree", str(ROOT))]
        rows: dict[str, list[dict]] = {name: [] for name, _ in trees}
        for r in range(args.rounds):
            for name, path in trees if r % 2 == 0 else trees[::-1]:
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child",
                       "--model", args.model, "--batch", str(args.batch),
                       "--threads", str(args.threads), "--runs", str(args.runs)]  # fmt: skip
                env = {**os.environ, "PYTHONPATH": path}
                text = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
                rows[name].append(json.loads(text.stdout.strip().splitlines()[-1]))
    print(f"{args.model} b{args.batch} threads {args.threads}: {args.rounds} blocks of "
          f"{args.runs} runs each (median of blocks; per-block values)")  # fmt: skip
    for name, blocks in rows.items():
        med = {k: round(float(np.median([b[k] for b in blocks])), 3) for k in blocks[0]}
        keys = ("wall_ms", "cpu_ms", "outside_thread_cpu_us")
        per = {k: [round(b[k], 2) for b in blocks] for k in keys}
        print(f"{name:>10}: {med} {per}")


if __name__ == "__main__":
    main()
