"""Memory planning on the built-in models: the arena memory_coloring plans, against the
liveness lower bound and against giving every intermediate its own buffer.

    python benchmarks/memory_plan.py [--seq-len 128] [--json out.json]

For each model: the three sizes in MiB, arena / lower bound (goal <= 1.15), and the saving over
one buffer per intermediate (goal >= 70%), plus the optimisation time.
"""

from __future__ import annotations

import argparse
import json
import time

import pygraphx
from pygraphx.models import get_model

MODELS = ["resnet50", "mobilenetv2", "bert_base", "gpt2"]


def measure(name: str, seq_len: int, batch: int) -> dict[str, float]:
    model = get_model(name, batch=batch, seq_len=seq_len)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    start = time.perf_counter()
    pygraphx.optimize(prog)
    elapsed = time.perf_counter() - start
    plan = prog.get_main_module().memory_plan
    return {
        "arena_bytes": plan.arena_bytes,
        "lower_bound_bytes": plan.lower_bound,
        "naive_bytes": plan.naive_bytes,
        "arena_over_lower_bound": plan.arena_bytes / plan.lower_bound,
        "saving_vs_naive": 1 - plan.arena_bytes / plan.naive_bytes,
        "optimize_seconds": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()
    mib = 1 << 20
    rows = {}
    print(f"{'model':<12} {'arena MiB':>10} {'lower MiB':>10} {'naive MiB':>10} "
          f"{'arena/lower':>12} {'saving':>8} {'optimize':>9}")  # fmt: skip
    for name in MODELS:
        r = measure(name, args.seq_len, args.batch)
        rows[name] = r
        print(
            f"{name:<12} {r['arena_bytes'] / mib:>10.2f} {r['lower_bound_bytes'] / mib:>10.2f} "
            f"{r['naive_bytes'] / mib:>10.2f} {r['arena_over_lower_bound']:>12.3f} "
            f"{r['saving_vs_naive']:>8.1%} {r['optimize_seconds']:>8.2f}s",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
