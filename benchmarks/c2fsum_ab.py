"""The concat + 1x1 convolution of YOLOv8's C2f / SPPF blocks as a sum chain of per-part
convolutions (`PGX_CONV_CONCAT_SUM`, `torch_lowering/conv_concat.py`): A/B in one process.

    python benchmarks/c2fsum_ab.py --threads 1 2 --rounds 6 --repeat 8      # yolov8_style 640
    python benchmarks/c2fsum_ab.py --size test --modes off on measure
    python benchmarks/c2fsum_ab.py --layers --threads 1                      # per-layer table
    python benchmarks/c2fsum_ab.py --steps --threads 1                       # in the network

Every mode's program is compiled from the same ONNX model (the mode is read at compile);
timing alternates blocks of runs (a warm-up run, then `--repeat` timed runs) of the modes, the
order reversed every round, so load from other processes falls on all alike. Reported per
mode: median wall ms over all timed runs, the best block median, and mean process CPU ms per
run (all threads of this process: what other processes' load inflates least), the number of
sum chains, and the relative RMS error of the output against ONNX Runtime.

`--layers`: the YOLOv8n (640x640) concat + 1x1 convolution shapes, each timed as the compile
times it (`conv_concat.time_chain`: best of 5 interleaved calls, caches flushed between),
several times over.

`--steps`: the `off` and `on` programs' steps timed one by one in the network (the programs
alternating runs, `--repeat` runs each after two warm-ups; thread CPU time; 1 thread only:
on 2 threads, steps called one by one from Python ran twice as long as in a run):
each concat feeding a convolution and that convolution's step against the chain's one step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cpu_vs_peers import load_zoo, make_ort, make_pygraphx, relative_error  # noqa: E402
from pygraphx.targets.torch_lowering import conv_concat  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan  # noqa: E402

#: YOLOv8n at 640x640: (parts' channels, side, output channels) of each concat + 1x1 conv
YOLO_LAYERS = [
    ([32, 16], 160, 32),  # stem C2f
    ([64, 32, 32], 80, 64),  # P3 C2f (n=2)
    ([128, 64, 64], 40, 128),  # P4 C2f (n=2)
    ([256, 128], 20, 256),  # P5 C2f
    ([128, 128, 128, 128], 20, 256),  # SPPF
    ([128, 64], 40, 128),  # neck C2f top4 / out4 (second 1x1)
    ([64, 32], 80, 64),  # neck C2f out3
    ([256, 128], 20, 256),  # neck C2f out5
    ([64, 128], 40, 128),  # neck: down3(o3) + t4 into out4's first 1x1
    ([128, 256], 20, 256),  # neck: down4(o4) + c5 into out5's first 1x1
]
#: the neck's concats of an upsample x2 (the first part) and a backbone level
YOLO_UP_LAYERS = [
    ([256, 128], 40, 128),  # up(c5) + c4 into top4's first 1x1
    ([128, 64], 80, 64),  # up(t4) + c3 into out3's first 1x1
]


def ab(size: str, threads: int, modes: list[str], rounds: int, repeat: int) -> None:
    model, feeds, _ = load_zoo("yolov8_style", size)
    want = make_ort(model, threads)[0](feeds)
    runs = {}
    for mode in modes:
        os.environ[conv_concat.MODE_ENV] = mode
        run, seconds, prog = make_pygraphx(model, "arena", threads)
        chains = prog._executable.lowered.ctx.cache.get("conv_concat_sum", 0)
        err = relative_error([np.asarray(a, np.float64) for a in prog.run(feeds)], want)
        print(f"  t{threads} {mode}: compile {seconds:.2f} s, {chains} sum chain(s), "
              f"rel error vs ORT {err:.2e}", flush=True)  # fmt: skip
        runs[mode] = run
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    blocks: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            runs[mode](feeds)
            block = []
            for _ in range(repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                runs[mode](feeds)
                block.append((time.perf_counter() - t0, time.process_time() - c0))
            times[mode] += block
            blocks[mode].append(statistics.median(w for w, _ in block))
    for mode in modes:
        wall = statistics.median(w for w, _ in times[mode]) * 1e3
        cpu = statistics.fmean(c for _, c in times[mode]) * 1e3
        print(f"yolov8_style {size} t{threads} {mode:>7}: wall {wall:7.2f} ms (best block "
              f"{min(blocks[mode]) * 1e3:7.2f}), cpu {cpu:7.2f} ms/run", flush=True)  # fmt: skip


def layers(threads: int, times: int) -> None:
    torch.set_num_threads(threads)
    shapes = [(*layer, None) for layer in YOLO_LAYERS]
    shapes += [(*layer, (0, [2, 2])) for layer in YOLO_UP_LAYERS]
    for lengths, side, k, up in shapes:
        c = sum(lengths)
        w = torch.randn(k, c, 1, 1) * 0.1
        plan = ConvPlan(w, w, [1, c, side, side], [0, 0], [1, 1], [1, 1], 1, None)
        best: dict[str, list[float]] = {"concat": [], "sum": []}
        for _ in range(times):
            for name, s in conv_concat.time_chain(plan, lengths, float("inf"), up).items():
                best[name].append(s * 1e6)
        a, b = (statistics.median(best[n]) for n in ("concat", "sum"))
        label = ("up " if up else "") + "+".join(map(str, lengths))
        print(f"t{threads} {label:>16}ch {side:>3}x{side:<3} -> {k:>3}: "
              f"concat+conv {a:7.1f} us, sum chain {b:7.1f} us ({b / a - 1:+.0%})",
              flush=True)  # fmt: skip


def steps(size: str, threads: int, repeat: int) -> None:
    if threads != 1:  # (steps called one by one on 2 threads ran twice as long as in a run)
        raise SystemExit("--steps: 1 thread only")
    model, feeds, _ = load_zoo("yolov8_style", size)
    progs = {}
    for mode in ("off", "on"):
        os.environ[conv_concat.MODE_ENV] = mode
        progs[mode] = make_pygraphx(model, "arena", threads)[2]
    torch.set_num_threads(threads)
    clock = time.thread_time if threads == 1 else time.perf_counter
    spent = {m: np.zeros(len(p._executable.lowered.steps)) for m, p in progs.items()}
    for r in range(repeat + 2):
        for mode, prog in progs.items():
            prog._executable.executor.bind(feeds)
            with torch.inference_mode():
                for k, step in enumerate(prog._executable.lowered.steps):
                    t0 = clock()
                    step.fn()
                    spent[mode][k] += (clock() - t0) * 1e6 if r >= 2 else 0.0
    rows: dict[str, list[float]] = {"off": [], "on": []}
    for mode, prog in progs.items():
        ss, us = prog._executable.lowered.steps, spent[mode] / repeat
        for k, step in enumerate(ss):
            names = [i.op.name for i in step.instructions]
            if "concat" in names and "convolution" in names:  # a chain
                rows[mode].append(us[k])
            elif names[-1] == "concat" and conv_concat.sum_conv(step.instructions[-1]):
                rows[mode].append(us[k] + us[k + 1])  # the concat, then its convolution
    for a, b in zip(rows["off"], rows["on"], strict=True):
        print(
            f"t{threads} concat + conv steps {a:7.1f} us, chain step {b:7.1f} us ({b / a - 1:+.0%})"
        )
    a, b = (sum(rows[m]) / 1e3 for m in ("off", "on"))
    whole_a, whole_b = (spent[m].sum() / repeat / 1e3 for m in ("off", "on"))
    print(f"t{threads} all such steps: {a:.2f} -> {b:.2f} ms; whole run {whole_a:.2f} -> "
          f"{whole_b:.2f} ms")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="full", choices=["full", "test"])
    p.add_argument("--modes", nargs="+", default=["off", "on"], choices=conv_concat.MODES)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeat", type=int, default=8)
    p.add_argument("--layers", action="store_true", help="the per-layer table instead")
    p.add_argument("--times", type=int, default=5, help="--layers: timings per layer")
    p.add_argument("--steps", action="store_true", help="the in-network step table instead")
    args = p.parse_args(argv)
    for threads in args.threads:
        if args.layers:
            layers(threads, args.times)
        elif args.steps:
            steps(args.size, threads, args.repeat)
        else:
            ab(args.size, threads, args.modes, args.rounds, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
