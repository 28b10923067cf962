"""Where a run's time outside its steps goes (run17), the whole of `Program.run`: the lead-in
(checks, `_check_params`, trace switch, locks), bind, the run scope's enter, the steps, the
scope's exit, collect, the lead-out (`_owned_arguments`: the owned outputs' `Argument`s); and
`Program.run` itself less its steps in the same run (the last column: the figure to compare;
the pieces are stamped on a copy of the code, so they show where). Two variants in one process
(`--old` / `--new`: settings in force while each compiles, `ab_harness` syntax incl.
`@cpu.module.NAME=literal`), alternating run by run; medians in us, thread CPU time and wall.

    python benchmarks/run17_overhead.py --model mobilenetv2 --threads 1 --runs 400 \
        --old "PGX_SOME_SWITCH=0" --new ""

(run17's A/B, benchmarks/results/run17.md, set `--old "@cpu.target.LEAN_RUN=False
@cpu.scheduling.LEAN_SCOPE=False @pygraphx.ir.program.LEAN_RUN=False"`: tidy18 removed those
switches and the old path behind them; check out main before tidy18 to run that A/B again. The
stamped lead-out was the old `_unaliased` + `_argument`, now the one path's `_owned_arguments`.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402
from pygraphx.ir import program as P  # noqa: E402
from pygraphx.ir.trace import with_eval_trace  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402

NAMES = ["lead_in", "bind", "enter", "steps", "exit", "collect", "lead_out", "outside",
         "total", "run()", "run() outside steps"]  # fmt: skip


def one_run(prog, feeds: dict, clock) -> list[int]:  # noqa: ANN001
    """`Program.run`'s static path, stamped (mirrors program.py and target.py)."""
    t0 = clock()
    ex = prog._executable
    device_io = getattr(ex, "takes_device_arguments", None)
    assert device_io is None or not device_io(feeds)
    arrays = prog._check_params(feeds)
    observer = with_eval_trace(prog.get_main_module(), None)
    assert observer is None
    with ex._lock:  # (the cpu executable is reentrant: the program takes no lock of its own)
        e = ex.executor
        t1 = clock()
        e.bind(arrays)
        t2 = clock()
        s = e.context()
        s.__enter__()
        t3 = clock()
        for st in e.steps:
            st()
        t4 = clock()
        s.__exit__(None, None, None)
        t5 = clock()
        outs = e.collect()
        t6 = clock()
    results = P._owned_arguments(outs, arrays)
    P._grouped(results, prog.output_structure)
    t7 = clock()
    t = [t0, t1, t2, t3, t4, t5, t6, t7]
    d = [b - a for a, b in zip(t, t[1:], strict=False)]
    return d + [t7 - t0 - d[3], t7 - t0]


def stamp_steps(prog) -> list[int]:  # noqa: ANN001
    """Makes the program's steps one step that stamps its start and end (a `clock` each run)
    into the returned list: `Program.run`'s own time outside its steps, in the same run."""
    e = prog._executable.executor
    steps = e.steps
    box = [0, 0, time.perf_counter_ns]

    def all_steps() -> None:
        box[0] = box[2]()
        for st in steps:
            st()
        box[1] = box[2]()

    e.steps = (all_steps,)
    return box


def whole_run(prog, feeds: dict, clock, box: list) -> list[int]:  # noqa: ANN001
    """`Program.run` as a user calls it: its time, and its time less its steps' (same run)."""
    box[2] = clock
    t0 = clock()
    prog.run(feeds)
    t1 = clock()
    return [t1 - t0, t1 - t0 - (box[1] - box[0])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--runs", type=int, default=400)
    p.add_argument("--old", default="")
    p.add_argument("--new", default="")
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = get_model(args.model, batch=args.batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs(args.model, model).items()}
    case = ab.Case("", model.SerializeToString(), {})
    progs = {}
    for name, text in (("old", args.old), ("new", args.new)):
        v = ab.parse_variant(f"{name}:{text.replace(' ', ',')}")
        progs[name] = ab.compile_variant(case, args.threads, ab.Variant(name, v.env, args.bf16))
    boxes = {}
    for name, prog in progs.items():
        for _ in range(20):
            prog.run(feeds)
        orig = prog._executable.executor.steps
        boxes[name] = (stamp_steps(prog), prog._executable.executor.steps, orig)
    load = Path("/proc/loadavg").read_text().split()[0]
    rows: dict[str, dict[str, list]] = {n: {"cpu": [], "wall": []} for n in progs}
    order = list(progs.items())
    for r in range(args.runs):
        for name, prog in order if r % 2 == 0 else order[::-1]:
            box, stamped, orig = boxes[name]
            e = prog._executable.executor
            for kind, clock in (("cpu", time.thread_time_ns), ("wall", time.perf_counter_ns)):
                e.steps = orig
                a = one_run(prog, feeds, clock)
                e.steps = stamped
                b = whole_run(prog, feeds, clock, box)
                rows[name][kind].append(a + b)
    print(f"{args.model} b{args.batch} threads {args.threads} runs {args.runs} old {args.old!r} "
          f"new {args.new!r} bf16 {args.bf16} steps "
          f"{ {n: len(pr._executable.executor.steps) for n, pr in progs.items()} } load {load} "
          f"-> {Path('/proc/loadavg').read_text().split()[0]}")  # fmt: skip
    for name, got in rows.items():
        for kind, vals in got.items():
            med = np.median(np.array(vals), axis=0) / 1e3
            print(name, kind, {k: round(float(v), 1) for k, v in zip(NAMES, med, strict=True)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
