"""ResNet-50's steps by kind of convolution (1x1 / 3x3 / 7x7, stride, wide input), timed as
they run (`targets/cpu/profile.time_steps`: thread CPU time at one thread, else wall), with
each kind's direct-convolution GFLOP/s (a Winograd layer counts its direct multiply-adds),
then every 1x1 layer on its own.

    python benchmarks/wino2_steps.py --batch 1 --threads 1 [--layers] [--runs 10]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,I001  (first: pygraphx sets OpenMP's spin count before torch)
import numpy as np  # noqa: E402

from pygraphx.models import get_model  # noqa: E402
from pygraphx.targets.cpu.profile import StepTime, time_steps  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import winograd_rule  # noqa: E402


def conv_kind(step: StepTime, batch: int) -> tuple[str, tuple, int]:
    """(kind, (input CHW, K, stride, instructions in the step), direct multiply-adds)."""
    convs = [i for i in step.instructions if i.op.name == "convolution"]
    if not convs:
        names = ",".join(sorted({i.op.name for i in step.instructions}))
        return "other:" + names[:40], (), 0
    c = convs[0]
    xl, wl = (tuple(i.shape.lens()) for i in c.inputs[:2])
    k, stride = wl[2:], c.op.stride[0]
    wide = " cin>=256" if wl[1] >= 256 and k == (1, 1) else ""
    hout = (xl[2] + 2 * c.op.padding[0] - k[0]) // stride + 1
    macs = batch * wl[0] * wl[1] * k[0] * k[1] * hout * hout
    layer = (xl[1:], wl[0], stride, len(step.instructions))
    return f"conv {k[0]}x{k[1]} s{stride}{wide}", layer, macs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", action="store_true", help="also print every step in run order")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--rule", help="C:T: the Winograd rule's fewest channels and tiles")
    args = ap.parse_args()
    if args.rule:
        channels, tiles = map(int, args.rule.split(":"))
        winograd_rule.rule_limits = lambda _threads: (channels, tiles)
    model = get_model("resnet50", batch=args.batch)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=args.threads))
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    feeds = {model.graph.input[0].name: x}
    prog.run(feeds)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    wall0 = time.perf_counter()
    for _ in range(args.runs):
        prog.run(feeds)
    wall = (time.perf_counter() - wall0) / args.runs
    steps = time_steps(prog._executable, feeds, args.runs, clock)
    kinds: dict = defaultdict(lambda: [0.0, 0, 0])
    ones: dict = defaultdict(lambda: [0.0, 0, 0])
    for step in steps:
        kind, layer, macs = conv_kind(step, args.batch)
        for table, key in ((kinds, kind), (ones, layer if kind.startswith("conv 1x1") else None)):
            if key is not None:
                row = table[key]
                row[0], row[1], row[2] = row[0] + step.seconds, row[1] + 1, row[2] + macs
    total = sum(row[0] for row in kinds.values())
    for key, (sec, n, macs) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        rate = 2 * macs / sec / 1e9
        print(f"{key:40s} n={n:3d} {sec * 1e3:8.2f} ms ({sec / total:5.1%}) {rate:6.1f} GFLOP/s")
    print(f"total {total * 1e3:.2f} ms (run wall, mean of {args.runs}: {wall * 1e3:.2f} ms)\n")
    for key, (sec, n, macs) in sorted(ones.items(), key=lambda kv: -kv[1][0]):
        print(f"1x1 {key} n={n} {sec / n * 1e3:.3f} ms each, {2 * macs / sec / 1e9:.1f} GFLOP/s")
    if args.layers:
        print()
        for i, step in enumerate(steps):
            kind, layer, macs = conv_kind(step, args.batch)
            rate = 2 * macs / step.seconds / 1e9 if step.seconds else 0.0
            print(f"{i:3d} {kind:24s} {layer!s:32s} {step.seconds * 1e3:7.3f} ms {rate:6.1f} GF/s")


if __name__ == "__main__":
    main()
