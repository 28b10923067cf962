"""ResNet-50's 1x1 and 7x7 steps as they run under several compile modes of `benchmarks/rn12_ab.py`
(helper rn12), in one process: each mode's steps timed by `targets/cpu/profile.time_steps`
(thread CPU time at one thread, else wall), rounds alternated, per step the best round.

    PGX_CPU_LOAD_ADAPT=0 PGX_CONV_CHOICE_CACHE=off PYTHONPATH=. python \\
        benchmarks/rn12_steps_ab.py --batch 8 --threads 1 --modes rule rule/res_off
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,I001  (first: pygraphx sets OpenMP's spin count before torch)

from benchmarks import rn12_ab  # noqa: E402
from benchmarks.arena_conv_ab import load  # noqa: E402
from benchmarks.wino2_steps import conv_kind  # noqa: E402
from pygraphx.targets.cpu.profile import StepTime, time_steps  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--modes", nargs="+", default=["rule", "rule/res_off"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    _, model, feeds = load(f"resnet50:{args.batch}")
    progs = {}
    plain = pygraphx.parse_onnx_buffer
    for mode in args.modes:
        made: list = []

        def parse(buf: bytes, **kw: object) -> object:
            made.append(plain(buf, **kw))
            return made[-1]

        with mock.patch.object(pygraphx, "parse_onnx_buffer", parse):
            _, note = rn12_ab.compile_mode(model, mode, args.threads, "1")
        progs[mode] = made[-1]
        print(f"{mode}: {note}")
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    best: dict[str, list[StepTime]] = {}
    for _ in range(args.rounds):
        for mode, prog in progs.items():
            prog.run(feeds)
            steps = time_steps(prog._executable, feeds, args.runs, clock)
            old = best.get(mode)
            best[mode] = steps if old is None else [
                StepTime(a.instructions, min(a.seconds, b.seconds)) for a, b in zip(old, steps)
            ]  # fmt: skip
    print(f"step kind layer (input CHW, K, stride, instructions): ms per mode {args.modes}")
    for i, row in enumerate(zip(*best.values(), strict=True)):
        kind, layer, _ = conv_kind(row[0], args.batch)
        if kind.startswith(("conv 1x1", "conv 7x7")):
            times = " ".join(f"{s.seconds * 1e3:8.3f}" for s in row)
            print(f"{i:3d} {kind:22s} {layer!s:32s} {times}")
    totals = " ".join(f"{sum(s.seconds for s in steps) * 1e3:.2f}" for steps in best.values())
    print(f"sum of all steps: {totals}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
