"""A/B of mnv17's changes (new: the default) against the old path (`--old`, by default
`PGX_CPU_NATIVE_MBCHAIN=0`: every native block its own step) on one model, in one process,
alternating blocks (the order reversed every round), both variants checked against ONNX
Runtime first:

    python benchmarks/mnv17_ab.py --model mobilenetv2 --threads 2 --batch 1 --rounds 10
        --runs 20 [--new-first] [--old K=V,...] [--new K=V,...] [--bf16] [--quiet SECONDS]
        [--json FILE]

`--model`: mobilenetv2, resnet50, bert_base (`pygraphx.models`). Each variant is compiled
(`mnv2b1_ab.compiled`: the environment, or `@module.NAME` patches, set only while it
compiles), warmed; with `--quiet S` the timing waits (at most S seconds) for a quiet moment
(`/proc/stat` busy < 15 % over 2 s) and says whether the machine was quiet before and after.
Printed per variant: the median over blocks of the wall and process CPU time a run, and the
minimum block. (mnv16_ab.py's loop, with the model a choice.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnv2b1_ab import compiled, ort_output  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402


def busy(seconds: float = 2.0) -> float:
    """The fraction of the machine's CPU time spent busy over `seconds`."""

    def read() -> list[int]:
        return [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]

    a = read()
    time.sleep(seconds)
    b = read()
    d = [y - x for x, y in zip(a, b, strict=False)]
    idle = d[3] + d[4]
    return 1.0 - idle / max(1, sum(d[:8]))


def wait_quiet(limit: float) -> str:
    """Wait at most `limit` seconds for busy < 15 % over 2 s; what was seen."""
    start = time.monotonic()
    while True:
        b = busy()
        if b < 0.15:
            return f"quiet (busy {b:.0%})"
        if time.monotonic() - start > limit:
            return f"not quiet (busy {b:.0%})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--new-first", action="store_true")
    p.add_argument("--old", default="PGX_CPU_NATIVE_MBCHAIN=0",
                   help="K=V,...: the old variant")
    p.add_argument("--bf16", action="store_true", help="both variants quantize_bf16'd")
    p.add_argument("--new", default="", help="K=V,K=V: the new variant (default: nothing set)")
    p.add_argument("--quiet", type=float, default=0.0, help="wait for a quiet moment (s)")
    p.add_argument("--json", default=None)
    p.add_argument("--per-run", action="store_true",
                   help="also alternate single runs (rounds x runs of each) and report the "
                        "median of each run's wall and thread CPU time")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = get_model(args.model, batch=args.batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs(args.model, model).items()}
    def env(text: str) -> dict[str, str]:
        return dict(kv.split("=", 1) for kv in text.split(",") if kv)

    variants = {"old": env(args.old), "new": env(args.new)}
    names = list(variants)[::-1] if args.new_first else list(variants)
    progs = {n: compiled(model, args.threads, variants[n], bf16=args.bf16) for n in names}
    want = ort_output(model, feeds, args.threads)
    diffs = {n: float(np.abs(np.asarray(pr.run(feeds)[0]) - want).max()) for n, pr in progs.items()}
    for prog in progs.values():
        for _ in range(3):
            prog.run(feeds)
    steps = {n: len(pr._executable.executor.steps) for n, pr in progs.items()}
    before = wait_quiet(args.quiet) if args.quiet else "not checked"
    rows = {n: {"wall_ms": [], "cpu_ms": []} for n in progs}
    order = list(progs.items())
    for r in range(args.rounds):
        for name, prog in order if r % 2 == 0 else order[::-1]:
            prog.run(feeds)
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(args.runs):
                prog.run(feeds)
            rows[name]["cpu_ms"].append((time.process_time() - c0) / args.runs * 1e3)
            rows[name]["wall_ms"].append((time.perf_counter() - w0) / args.runs * 1e3)
    single: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in progs}
    if args.per_run:  # each run alone, the variants alternating run by run
        for r in range(args.rounds * args.runs):
            for name, prog in order if r % 2 == 0 else order[::-1]:
                c0, w0 = time.thread_time(), time.perf_counter()
                prog.run(feeds)
                single[name]["wall"].append((time.perf_counter() - w0) * 1e3)
                single[name]["cpu"].append((time.thread_time() - c0) * 1e3)
    after = wait_quiet(0) if args.quiet else "not checked"
    print(f"{args.model}{' bf16' if args.bf16 else ''} batch {args.batch} threads {args.threads} "
          f"rounds {args.rounds} x "
          f"{args.runs}, order {names}, {variants}; "
          f"machine before: {before}, after: {after}")  # fmt: skip
    summary = {}
    for name, cols in rows.items():
        med = {k: round(float(np.median(v)), 3) for k, v in cols.items()}
        med["wall_min_block_ms"] = round(float(np.min(cols["wall_ms"])), 3)
        med["max_abs_diff_vs_ort"] = diffs[name]
        med["steps"] = steps[name]
        if args.per_run:
            med["run_wall_median_ms"] = round(float(np.median(single[name]["wall"])), 4)
            med["run_thread_cpu_median_ms"] = round(float(np.median(single[name]["cpu"])), 4)
            med["run_wall_p10_ms"] = round(float(np.percentile(single[name]["wall"], 10)), 4)
        summary[name] = med
        print(name, med)
    print("new/old wall (median, min block): "
          f"{summary['new']['wall_ms'] / summary['old']['wall_ms']:.3f}, "
          f"{summary['new']['wall_min_block_ms'] / summary['old']['wall_min_block_ms']:.3f}")
    if args.per_run:
        ratios = [summary["new"][k] / summary["old"][k] for k in
                  ("run_wall_median_ms", "run_thread_cpu_median_ms", "run_wall_p10_ms")]
        print("new/old single runs (wall median, thread cpu median, wall p10): "
              + ", ".join(f"{r:.4f}" for r in ratios))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "summary": summary,
                                               "before": before, "after": after}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
