"""Where a cpu run's time outside the steps goes: each phase of `Program.run` timed inside
real runs (median us over runs), the phases done as `Executor.run` and `RunScope` do them.

    python benchmarks/chain11_run_phases.py --model mobilenetv2 --threads 2 --runs 300

Phases: program (`Program.run` less the executable's run), bind, the scope's entry (torch's
thread count read, the load check, the budget's acquire, set_threads, inference mode on),
the steps, the scope's exit (inference mode off, the thread count restored, the budget's
release), collect. Each phase comes cold after the steps, as in a real run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402

PHASES = ["bind", "get_threads", "load_check", "acquire", "set_threads", "mode_enter", "steps",
          "mode_exit", "restore_threads", "release", "collect"]  # fmt: skip


def phased_run(exe: object, feeds: dict) -> list[int]:
    """One run as `CpuExecutable.run` makes it, a perf_counter_ns stamp after each phase."""
    import torch

    from pygraphx.targets.cpu import scheduling as sch

    ns, scope, ex = time.perf_counter_ns, exe.scope, exe.executor
    t = [ns()]
    ex.bind(feeds)
    t.append(ns())
    before = torch.get_num_threads()
    t.append(ns())
    want = (
        scope._load_threads()
        if hasattr(scope, "_load_threads")
        else sch.load_threads(scope.n, cpus=scope._cpus, usable=scope._usable)
    )
    t.append(ns())
    got = sch.BUDGET.acquire(want)
    t.append(ns())
    scope.limit[0] = got
    sch.set_threads(got)
    t.append(ns())
    mode = scope._inference(True) if hasattr(scope, "_inference") else scope._mode
    mode.__enter__()
    t.append(ns())
    for step in ex.steps:
        step()
    t.append(ns())
    mode.__exit__(None, None, None)
    t.append(ns())
    torch.set_num_threads(before)
    t.append(ns())
    sch.BUDGET.release()
    t.append(ns())
    ex.collect()
    t.append(ns())
    return [b - a for a, b in zip(t, t[1:], strict=False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenetv2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=300)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    model = get_model(args.model, batch=args.batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs(args.model, model).items()}
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu", threads=args.threads))
    exe = prog._executable
    whole, inner = [], []
    rows = []
    for _ in range(args.runs):
        start = time.perf_counter_ns()
        prog.run(feeds)
        mid = time.perf_counter_ns()
        exe.run(feeds)
        end = time.perf_counter_ns()
        whole.append(mid - start)
        inner.append(end - mid)
        with exe._lock:
            rows.append(phased_run(exe, feeds))
    med = np.median(np.array(rows), axis=0) / 1e3
    print(f"{args.model} b{args.batch} threads {args.threads}, median us over {args.runs} runs")
    print(f"  Program.run {np.median(whole) / 1e3:.1f}, executable run "
          f"{np.median(inner) / 1e3:.1f}, program layer "
          f"{np.median(np.array(whole) - np.array(inner)) / 1e3:.1f}")  # fmt: skip
    for name, us in zip(PHASES, med, strict=True):
        print(f"  {name:>16}: {us:8.1f}")
    print(f"  {'outside steps':>16}: {med.sum() - med[PHASES.index('steps')]:8.1f}")


if __name__ == "__main__":
    main()
