"""The YOLOv8-style detector (640) in bf16 under the conv choice's modes (`conv_kernel=`:
`impl`, the default; `measure`, every kernel of `conv_choice.MEASURED` and oneDNN's
implementations timed; `off`, oneDNN's first everywhere): A/B in one process.

    PYTHONPATH=. python benchmarks/yolo13_conv_modes.py --threads 1 --rounds 12 --repeat 3

Each mode's program is quantized (`quantize_bf16`) and compiled from the same model with
`cpu_vs_peers.py`'s settings; timing alternates blocks (a warm-up run, `--repeat` timed runs)
of the modes, the order reversed every round. Printed: median wall ms, best block, mean
process CPU ms per run (1 thread: what other processes' load inflates least), and the relative
RMS error against ONNX Runtime float32.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from benchmarks.cpu_engines import make_ort  # noqa: E402
from benchmarks.yolo13_ab import load, rel_rms  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="yolov8_style")
    ap.add_argument("--modes", nargs="+", default=["impl", "measure", "off"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"loadavg at start: {Path('/proc/loadavg').read_text().split()[0]}", flush=True)
    model, feeds = load(args.model)
    want = [np.asarray(w, np.float64) for w in make_ort(model, args.threads)[0](feeds)]
    progs = {}
    for mode in args.modes:
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        pygraphx.quantize_bf16(prog)
        target = CpuTarget(
            conv_output="arena", threads=args.threads, step_threads=True, conv_kernel=mode
        )
        prog.compile(target)
        err = rel_rms([np.asarray(a) for a in prog.run(feeds)], want)
        print(f"{args.model} t{args.threads} {mode}: rel err {err:.2e}", flush=True)
        progs[mode] = prog
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in progs}
    blocks: dict[str, list[float]] = {m: [] for m in progs}
    for r in range(args.rounds):
        for mode in list(progs)[:: 1 if r % 2 == 0 else -1]:
            progs[mode].run(feeds)
            block = []
            for _ in range(args.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                progs[mode].run(feeds)
                block.append((time.perf_counter() - t0, time.process_time() - c0))
            times[mode] += block
            blocks[mode].append(statistics.median(w for w, _ in block))
    for mode in progs:
        wall = statistics.median(w for w, _ in times[mode]) * 1e3
        cpu = statistics.fmean(c for _, c in times[mode]) * 1e3
        print(f"  {mode:>8}: wall {wall:7.2f} ms (best block {min(blocks[mode]) * 1e3:7.2f}), "
              f"cpu {cpu:7.2f} ms/run", flush=True)  # fmt: skip
    print(f"loadavg at end: {Path('/proc/loadavg').read_text().split()[0]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
