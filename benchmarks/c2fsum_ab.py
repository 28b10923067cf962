"""The concat + 1x1 convolution of YOLOv8's C2f / SPPF blocks as a sum chain of per-part
convolutions (`PGX_CONV_CONCAT_SUM`, `torch_lowering/conv_concat.py`): A/B in one process.

    python benchmarks/c2fsum_ab.py --threads 1 2 --rounds 6 --repeat 8      # yolov8_style 640
    python benchmarks/c2fsum_ab.py --size test --modes off on measure
    python benchmarks/c2fsum_ab.py --layers --threads 1                      # per-layer table
    python benchmarks/c2fsum_ab.py --steps --threads 1                       # in the network

Every mode's program is compiled from the same ONNX model (the mode is read at compile); the
A/B is `benchmarks/ab_harness.py`'s (the one harness): blocks of runs (a settle run, then
`--repeat` timed runs) of the modes alternate, the order reversed every round, so load from
other processes falls on all alike. Reported per mode: the median block (wall at 2 threads,
thread CPU at 1), the best block, process CPU ms a run (all threads of this process), the
number of sum chains, and the relative RMS error of the output against ONNX Runtime.

`--layers`: the YOLOv8n (640x640) concat + 1x1 convolution shapes, each timed as the compile
times it (`conv_concat.time_chain`: best of 5 interleaved calls, caches flushed between),
several times over.

`--steps`: the `off` and `on` programs' steps timed one by one in the network (the programs
alternating runs, `--repeat` runs each after two warm-ups; thread CPU time; 1 thread only:
on 2 threads, steps called one by one from Python ran twice as long as in a run):
each concat feeding a convolution and that convolution's step against the chain's one step.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness  # noqa: E402
from benchmarks.cpu_vs_peers import load_zoo, make_pygraphx  # noqa: E402
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


def ab(args) -> int:
    """The modes' whole-network A/B: `benchmarks/ab_harness.py` on yolov8_style at `--size`."""
    named = {m: ab_harness.Variant(m, {conv_concat.MODE_ENV: m}) for m in conv_concat.MODES}
    args.variants = args.modes
    return ab_harness.run_args(args, named=named, models=[f"yolov8_style:{args.size}"],
                               note=chains)  # fmt: skip


def chains(prog) -> str:
    return f"{prog._executable.lowered.ctx.cache.get('conv_concat_sum', 0)} sum chain(s)"


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
    p = ab_harness.parser(__doc__.split("\n")[0], models=[], threads=[1, 2], rounds=6, runs=8,
                          settle=1, env_options=False)  # fmt: skip
    p.add_argument("--size", default="full", choices=["full", "test"])
    p.add_argument("--modes", nargs="+", default=["off", "on"], choices=conv_concat.MODES)
    p.add_argument("--layers", action="store_true", help="the per-layer table instead")
    p.add_argument("--times", type=int, default=5, help="--layers: timings per layer")
    p.add_argument("--in-network", "--steps", dest="in_network", action="store_true",
                   help="the in-network step table instead")  # fmt: skip
    args = p.parse_args(argv)
    if not (args.layers or args.in_network):
        return ab(args)
    for threads in args.threads:
        if args.layers:
            layers(threads, args.times)
        else:
            steps(args.size, threads, args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
