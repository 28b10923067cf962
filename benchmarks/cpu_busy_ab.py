"""The cpu target on a busy machine: its runs with and without the load rule of
`pygraphx/targets/cpu/scheduling.py`, against ONNX Runtime, in one process.

    python benchmarks/cpu_busy_ab.py bert_base --batch 1 --threads 2 --repeat 8

The program is compiled once with `threads=N`; the runs alternate (pygraphx with
`PGX_CPU_LOAD_ADAPT` on, pygraphx with it off, ORT with `intra_op_num_threads=N`), so load
from elsewhere hits all three alike. Prints the 1-minute load average, and per engine the wall
time (min and median) and the process CPU time (median) per run, and the median's ratio to
ORT's. On an idle machine "on" and "off" are the same program.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402  (before torch: pygraphx sets OpenMP's spin count)
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.cpu.scheduling import LOAD_ADAPT_ENV  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=["resnet50", "mobilenetv2", "bert_base", "gpt2"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=8)
    args = ap.parse_args()
    import onnxruntime as ort

    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=args.threads))
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )

    def pgx(adapt: str) -> Callable[[], object]:
        def run() -> object:
            os.environ[LOAD_ADAPT_ENV] = adapt
            return prog.run(dict(feeds))

        return run

    engines = {"adapt on": pgx("1"), "adapt off": pgx("0"), "ort": lambda: session.run(None, feeds)}
    wall: dict[str, list[float]] = {k: [] for k in engines}
    cpu: dict[str, list[float]] = {k: [] for k in engines}
    for run in engines.values():
        run()
    for _ in range(args.repeat):
        for name, run in engines.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    print(f"{args.model} b{args.batch}, {args.threads} threads; load average {os.getloadavg()}")
    ort_median = statistics.median(wall["ort"])
    for name in engines:
        med = statistics.median(wall[name])
        print(
            f"{name:10s} wall min {min(wall[name]) * 1e3:8.1f} ms, median {med * 1e3:8.1f} ms; "
            f"CPU median {statistics.median(cpu[name]) * 1e3:8.1f} ms; / ORT {med / ort_median:.2f}"
        )


if __name__ == "__main__":
    main()
