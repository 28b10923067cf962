"""Each layer-norm step of a model in its runs, two variants alternating in one process
(helper norms18): `--old` / `--new` environment settings (K=V,...) in force while each
compiles; per norm step (its place in the run) the median over the rounds of its time in the
run (thread CPU at one thread, wall time at more), and which step ran before it.

    PYTHONPATH=. python benchmarks/norms18_norm_steps.py --model gpt2:1 --old PGX_CPU_LAYERNORM_V2=0 --rounds 20
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import pygraphx  # noqa: E402
from benchmarks.ab_harness import load, parse_env, settings  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2:1")
    ap.add_argument("--old", default="")
    ap.add_argument("--new", default="")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--fastest", action="store_true", help="each norm's fastest, not median")
    ap.add_argument("--bf16", action="store_true", help="quantize_bf16 both programs")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    case = load(args.model)
    progs = {}
    for name, text in (("old", args.old), ("new", args.new)):
        with settings(parse_env(text)):
            prog = pygraphx.parse_onnx_buffer(case.data)
            if args.bf16:
                pygraphx.quantize_bf16(prog)
            prog.compile(CpuTarget(threads=args.threads))
        progs[name] = prog
    clock = time.thread_time_ns if args.threads == 1 else time.perf_counter_ns
    norms = {}
    for name, prog in progs.items():
        steps = prog._executable.lowered.steps
        norms[name] = [k for k, s in enumerate(steps) if s.instructions[0].op.name == "reduce_mean"]
        for _ in range(2):
            prog.run(case.feeds)
    times = {name: [[] for _ in norms[name]] for name in progs}

    for r in range(args.rounds):
        for name in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
            exe = progs[name]._executable
            fns = exe.executor.steps
            want = {k: j for j, k in enumerate(norms[name])}
            exe.executor.bind(case.feeds)
            with exe.scope():
                for k, fn in enumerate(fns):
                    s = clock()
                    fn()
                    e = clock()
                    if k in want:
                        times[name][want[k]].append(e - s)
            exe.executor.collect()
    steps = progs["old"]._executable.lowered.steps
    print(f"# {args.model} t{args.threads}{' bf16' if args.bf16 else ''}, {args.rounds} rounds, loadavg {os.getloadavg()}")
    print("norm  step  before                     old us   new us   new/old")
    tot = {"old": 0.0, "new": 0.0}
    for j, k in enumerate(norms["old"]):
        pick = 0 if args.fastest else len(times["old"][j]) // 2
        med = {n: sorted(times[n][j])[pick] / 1e3 for n in progs}
        for n in progs:
            tot[n] += med[n]
        before = " ".join(i.op.name for i in steps[k - 1].instructions[:2]) if k else "-"
        print(f"{j:4d} {k:5d}  {before:24s} {med['old']:8.1f} {med['new']:8.1f}   "
              f"{med['new'] / med['old']:.3f}")
    print(f"sum of {'fastest' if args.fastest else 'medians'}: old {tot['old']:.1f} us, new {tot['new']:.1f} us "
          f"({tot['new'] / tot['old']:.3f})")


if __name__ == "__main__":
    main()
