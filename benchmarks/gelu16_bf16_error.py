"""bf16 programs' error against ONNX Runtime float32 on several inputs, oneDNN's gelu (erf)
post-op on the bf16 FFN-up product (old) against the product written in float32 and the native
pass rounding GELU once to bf16 (new, `PGX_CPU_GELU_BF16_NATIVE=1`), beside OpenVINO bf16
(helper gelu16; inputs as `benchmarks/bf16acc14_precisions.py`'s: seed 0 the zoo's / the
built-in inputs, seed k > 0 others).

    PYTHONPATH=. python benchmarks/gelu16_bf16_error.py --models minilm bert_base --seeds 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import pygraphx  # noqa: E402
from benchmarks.bf16acc14_precisions import load  # noqa: E402
from benchmarks.cpu_engines import make_openvino, make_ort  # noqa: E402
from benchmarks.cpu_vs_peers import relative_error  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import native_gelu  # noqa: E402


def program(model, threads: int, native: bool):
    os.environ[native_gelu.BF16_ENV] = "1" if native else "0"
    try:
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=threads))
    finally:
        del os.environ[native_gelu.BF16_ENV]
    return lambda feeds: [np.asarray(a) for a in prog.run(feeds)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["minilm", "bert_base"])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    for name in args.models:
        model, inputs = load(name, 1)
        ort, _ = make_ort(model, args.threads)
        ov, _, _ = make_openvino(model, args.threads, None)
        engines = {"old": program(model, args.threads, False),
                   "new": program(model, args.threads, True), "ov_bf16": ov}  # fmt: skip
        rows: dict[str, list[float]] = {k: [] for k in engines}
        for seed in range(args.seeds):
            feeds = inputs(seed)
            want = ort(feeds)
            line = []
            for key, fn in engines.items():
                rows[key].append(relative_error(fn(feeds), want))
                line.append(f"{key} {rows[key][-1]:.4e}")
            print(f"{name} seed {seed}: " + ", ".join(line), flush=True)
        mean = ", ".join(f"{k} {statistics.mean(v):.4e}" for k, v in rows.items())
        print(f"{name} mean over {args.seeds} seeds: {mean}", flush=True)


if __name__ == "__main__":
    main()
