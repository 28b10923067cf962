"""bf16 programs end to end: 3x3 layers on oneDNN's bf16 kernels (`old`,
`PGX_WINOGRAD_NATIVE_BF16=0`) against the native F(4,3) kernel on bf16 activations (`new`, the
default), A/B in one process (helper bf16wino14, issue 10).

    PYTHONPATH=. python benchmarks/bf16wino14_ab.py --models unet_small yolov8_style \
        resnet50 mobilenetv2 --threads 2 --variants old new openvino

Models: `benchmarks/zoo.py`'s (UNet-small, YOLOv8-style, full size) or built-ins (batch 1).
bf16 = `quantize_bf16`'s default "products" policy (what `cpu_vs_peers --bf16` runs);
`openvino`: OpenVINO at its default precision (bf16 on a CPU with bf16 instructions). Each
program is compiled once (the switch is read at compile); timing alternates blocks of runs (a
warm-up run, then `--repeat` timed runs) of the variants, the order reversed every round (both
orders). Reported per variant: median wall ms over all timed runs, the best block's median,
mean process CPU ms per run, the relative RMS error against ONNX Runtime float32, and the
compile's convolution kernel counts (the `pygraphx.cpu` log line).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cpu_engines import make_openvino, make_ort, make_pygraphx  # noqa: E402
from benchmarks.cpu_vs_peers import load_zoo, relative_error  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.quantize.truncate_float import PRODUCTS  # noqa: E402
from pygraphx.targets.torch_lowering.winograd_native import BF16_ENV  # noqa: E402

VARIANTS = {"old": "0", "new": "1"}
ZOO = ("unet_small", "yolov8_style")


class _Chosen(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "convolution" in msg or "measured" in msg:
            self.lines.append(msg)


def load(name: str) -> tuple:
    if name in ZOO:
        model, feeds, _ = load_zoo(name, "full")
        return model, feeds
    model = get_model(name, batch=1)
    return model, model_inputs(name, model)


def ab(name: str, threads: int, variants: list[str], rounds: int, repeat: int) -> None:
    model, feeds = load(name)
    want = make_ort(model, threads)[0](feeds)
    runs = {}
    saved = os.environ.get(BF16_ENV)
    chosen = _Chosen()
    log = logging.getLogger("pygraphx.cpu")
    log.addHandler(chosen)
    log.setLevel(logging.INFO)
    for v in variants:
        if v == "openvino":
            run, seconds, used = make_openvino(model, threads, None)
            err = relative_error([np.asarray(a, np.float64) for a in run(feeds)], want)
            print(f"  {name} t{threads} openvino ({used}): compile {seconds:.2f} s, rel error "
                  f"vs ORT f32 {err:.3e}", flush=True)  # fmt: skip
            runs[v] = run
            continue
        os.environ[BF16_ENV] = VARIANTS[v]
        chosen.lines.clear()
        run, seconds, prog = make_pygraphx(model, "arena", threads, bf16=(PRODUCTS,))
        err = relative_error([np.asarray(a, np.float64) for a in prog.run(feeds)], want)
        print(f"  {name} bf16 t{threads} {v}: compile {seconds:.2f} s, rel error vs ORT f32 "
              f"{err:.3e}; {' | '.join(chosen.lines)}", flush=True)  # fmt: skip
        runs[v] = run
    log.removeHandler(chosen)
    if saved is None:
        os.environ.pop(BF16_ENV, None)
    else:
        os.environ[BF16_ENV] = saved
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    blocks: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            runs[v](feeds)
            block = []
            for _ in range(repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                runs[v](feeds)
                block.append((time.perf_counter() - t0, time.process_time() - c0))
            times[v] += block
            blocks[v].append(statistics.median(w for w, _ in block))
    base = statistics.median(w for w, _ in times[variants[0]])
    for v in variants:
        wall = statistics.median(w for w, _ in times[v])
        cpu = statistics.fmean(c for _, c in times[v]) * 1e3
        print(f"{name} bf16 t{threads} {v:>8}: wall {wall * 1e3:7.2f} ms (best block "
              f"{min(blocks[v]) * 1e3:7.2f}, x{wall / base:.3f} of {variants[0]}), "
              f"cpu {cpu:7.2f} ms/run", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["unet_small", "yolov8_style"])
    p.add_argument("--variants", nargs="+", default=["old", "new"],
                   choices=[*VARIANTS, "openvino"])  # fmt: skip
    p.add_argument("--threads", type=int, nargs="+", default=[2])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeat", type=int, default=8)
    args = p.parse_args(argv)
    print(f"# loadavg at start: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    for threads in args.threads:
        for name in args.models:
            ab(name, threads, args.variants, args.rounds, args.repeat)
    print(f"# loadavg at end: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
