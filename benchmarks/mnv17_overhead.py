"""Where a MobileNetV2 run's time outside its kernels goes (mnv17), in thread CPU time (robust
on the shared machine at 1 thread) and wall time: bind, the run scope's enter, the steps, the
scope's exit, collect; two variants in one process (`--old` / `--new`: the environment while
each compiles, default old = `PGX_CPU_NATIVE_MBCHAIN=0`), alternating run by run; medians in us.

    python benchmarks/mnv17_overhead.py --threads 1 --runs 400 [--batch 1] [--bf16]
        [--old K=V,...] [--new K=V,...]

The steps run the same kernels in both variants, so old - new of the steps' piece is the Python,
ctypes calls and fork/joins the chain saves (mnv16_overhead.py's loop, thread CPU added).
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

NAMES = ["bind", "enter", "steps", "exit", "collect", "total"]


def one_run(prog: object, feeds: dict, clock) -> list[int]:  # noqa: ANN001
    ex = prog._executable.executor
    t = [clock()]
    ex.bind(feeds)
    t.append(clock())
    s = ex.context()
    s.__enter__()
    t.append(clock())
    for st in ex.steps:
        st()
    t.append(clock())
    s.__exit__(None, None, None)
    t.append(clock())
    ex.collect()
    t.append(clock())
    return [b - a for a, b in zip(t, t[1:], strict=False)] + [t[-1] - t[0]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--runs", type=int, default=400)
    p.add_argument("--old", default="PGX_CPU_NATIVE_MBCHAIN=0")
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
    rows: dict[str, dict[str, list]] = {n: {"cpu": [], "wall": []} for n in progs}
    order = list(progs.items())
    for r in range(args.runs):
        for name, prog in order if r % 2 == 0 else order[::-1]:
            rows[name]["cpu"].append(one_run(prog, feeds, time.thread_time_ns))
            rows[name]["wall"].append(one_run(prog, feeds, time.perf_counter_ns))
    print(f"threads {args.threads} batch {args.batch} runs {args.runs} old {args.old!r} new "
          f"{args.new!r} bf16 {args.bf16} steps "
          f"{ {n: len(pr._executable.executor.steps) for n, pr in progs.items()} } load {load} "
          f"-> {Path('/proc/loadavg').read_text().split()[0]}")  # fmt: skip
    for name, got in rows.items():
        for kind, vals in got.items():
            med = np.median(np.array(vals), axis=0) / 1e3
            print(name, kind, {k: round(float(v), 1) for k, v in zip(NAMES, med, strict=True)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
