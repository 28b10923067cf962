"""Where a pygraphx `cpu` run's time goes: `bind`, the steps, `collect`, against `prog.run`, and
the steps by kind (`bertb1_profile.step_kinds`), with minor page faults a run.

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/gpt12_run_split.py --model gpt2 --bf16 \
        --threads 1 --runs 15

One thread: thread CPU time (robust on a shared machine); more: wall time. A run's time outside
its steps is bind + collect (+ the loop); `collect` copies an output that sits in an arena slot
(a later run would overwrite it), which is how gpt12 found the 25.7 MB copy of GPT-2's bf16
logits (1.8-2.0 ms a run at one thread, `lower_gemm._returned_fresh`). Also prints which outputs
are fresh (a step's own new tensor, handed over without a copy).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: its tree wins

import bertb1_profile as bp  # noqa: E402
import cpu_transformer_blocks as ctb  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bp.model_arguments(ap, model="gpt2", threads=1, runs=15)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    bp.time.perf_counter = clock  # the step timer of `bp.profiled_run`
    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    prog = ctb.compile_pgx(model.SerializeToString(), args)
    for _ in range(3):
        prog.run(feeds)
    exe = prog._executable
    ex = exe.executor
    cells: dict[str, list[float]] = {k: [] for k in ("prog.run", "bind", "steps", "collect")}
    faults = 0
    for _ in range(args.runs):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = clock()
        out = prog.run(feeds)
        cells["prog.run"].append(clock() - start)
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        del out
        start = clock()
        ex.bind(feeds)
        cells["bind"].append(clock() - start)
        with exe.scope():
            start = clock()
            for fn in ex.steps:
                fn()
            cells["steps"].append(clock() - start)
        start = clock()
        ex.collect()
        cells["collect"].append(clock() - start)
    kinds = bp.pgx_kinds(prog, feeds, args.runs)
    what = "thread CPU" if args.threads == 1 else "wall"
    precision = "bf16" if args.bf16 else "float32"
    print(f"{args.model} b{args.batch} {precision} t{args.threads}, {args.runs} runs, {what} ms "
          f"(median / min); minor faults a prog.run {faults / args.runs:.1f}")  # fmt: skip
    for k, v in cells.items():
        print(f"  {k:9s} {np.median(v) * 1e3:9.3f} / {min(v) * 1e3:9.3f}")
    print(f"  sum of each step's fastest run {sum(kinds.values()) * 1e3:.2f}:")
    for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"    {v * 1e3:8.2f}  {k}")
    lowered = exe.lowered
    for idx in lowered.outputs:
        t = lowered.ctx.env[idx]
        print(f"  output {tuple(t.shape)} {t.dtype}: fresh {idx in lowered.ctx.fresh}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
