"""`conv_output="torch"` vs `"arena"` on the cpu target: A/B in one process.

    python benchmarks/arena_conv_ab.py --threads 1 2 --rounds 6 --repeat 8
    python benchmarks/arena_conv_ab.py --models mobilenetv2:1 resnet50:1 yolov8_style
    python benchmarks/arena_conv_ab.py --bf16 --threads 1   # quantize_bf16 ("products") first

Both programs are compiled from the same ONNX model; the timing alternates blocks of runs
(warm-up run, then `--repeat` timed runs) of the two modes, the order swapped every round, so
load from other processes falls on both alike. Reported per mode: median wall ms over all timed
runs, the median of the block medians' minimum, and mean process CPU ms per run (all threads of
this process: what other processes' load inflates least). Outputs are checked against ONNX
Runtime (relative RMS error of the worst output) and the arena's size is printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cpu_vs_peers import load_zoo, make_ort, make_pygraphx, relative_error  # noqa: E402
from benchmarks.zoo import ZOO_NAMES  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402

MODES = ("torch", "arena")


def load(spec: str) -> tuple[str, onnx.ModelProto, dict[str, np.ndarray]]:
    """`name[:batch]` -> (label, model, inputs): a built-in model or a zoo model ("full")."""
    name, _, batch = spec.partition(":")
    if name in ZOO_NAMES:
        model, feeds, b = load_zoo(name, "full")
        return f"{name} b{b}", model, feeds
    model = get_model(name, batch=int(batch or 1))
    return f"{name} b{batch or 1}", model, model_inputs(name, model)


def ab(spec: str, threads: int, rounds: int, repeat: int, bf16: bool = False) -> None:
    label, model, feeds = load(spec)
    label += " bf16" if bf16 else ""
    want = make_ort(model, threads)[0](feeds)
    runs, arena = {}, {}
    for mode in MODES:
        run, _, prog = make_pygraphx(model, mode, threads, bf16=("products",) if bf16 else None)
        ctx = prog._executable.lowered.ctx
        arena[mode] = (ctx.plan.arena_bytes, ctx.cache.get("conv_into_slot", 0))
        err = relative_error([np.asarray(a, np.float64) for a in prog.run(feeds)], want)
        print(f"  {label} t{threads} {mode}: rel error vs ORT {err:.2e}", flush=True)
        runs[mode] = run
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    blocks: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            run = runs[mode]
            run(feeds)
            block = []
            for _ in range(repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                run(feeds)
                block.append((time.perf_counter() - t0, time.process_time() - c0))
            times[mode] += block
            blocks[mode].append(statistics.median(w for w, _ in block))
    for mode in MODES:
        wall = statistics.median(w for w, _ in times[mode]) * 1e3
        best = min(blocks[mode]) * 1e3
        cpu = statistics.fmean(c for _, c in times[mode]) * 1e3
        size, direct = arena[mode]
        print(
            f"{label:>18} t{threads} {mode:>5}: wall {wall:8.2f} ms (best block {best:8.2f}), "
            f"cpu {cpu:8.2f} ms/run, arena {size / 1e6:6.2f} MB, conv into slot {direct}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    models = ["mobilenetv2:1", "mobilenetv2:8", "resnet50:1", "yolov8_style"]
    p.add_argument("--models", nargs="+", default=models, help="name[:batch] or a zoo model")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeat", type=int, default=8)
    p.add_argument("--bf16", action="store_true", help="quantize_bf16 before compiling")
    args = p.parse_args(argv)
    for spec in args.models:
        for threads in args.threads:
            ab(spec, threads, args.rounds, args.repeat, args.bf16)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
