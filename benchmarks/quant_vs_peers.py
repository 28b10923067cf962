"""int8 vs fp32 on the `cpu` target, side by side with ONNX Runtime fp32 and int8.

    python benchmarks/quant_vs_peers.py                      # resnet50 and bert_base
    python benchmarks/quant_vs_peers.py --models resnet50 --repeat 5 --json out.json

Every engine runs the same built-in ONNX model (`pygraphx.models`, random weights) on the same
inputs, with the same thread count (`--threads`, default 2). The int8 models are calibrated on
the same `--calib` samples (`model_inputs(name, model, seed=k)`, k = 1..N):

* pygraphx int8: `quantize_int8(prog, cpu, samples)` (max |x| per tensor, weights per output
  channel, symmetric int8), then `compile(cpu)`;
* ONNX Runtime int8: `onnxruntime.quantization.quantize_static` on the same samples (QDQ
  format, per-channel weights, its defaults otherwise: uint8 activations, min-max calibration).

Timing is block-wise: each engine is timed in its own block (2 warm-up runs, then `--repeat`
timed runs), the engines one after another, the whole round twice; an engine's figure is the
median of its better block. Accuracy: the relative RMS error of each int8 engine's first output
against the same engine's fp32 output on the timing input. On a shared machine the figures are
only comparable within one run of this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402


def rel_rms(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sqrt(np.sum((got - want) ** 2) / np.sum(want**2)))


def pygraphx_engine(model: onnx.ModelProto, threads: int, calib: list | None) -> Callable:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    target = pygraphx.get_target("cpu", threads=threads)
    if calib is not None:
        start = time.perf_counter()
        pygraphx.quantize_int8(prog, target, calib)
        print(f"    pygraphx calibration + quantisation: {time.perf_counter() - start:.1f} s")
    prog.compile(target)
    fallbacks = getattr(prog._executable, "fallbacks", {})
    if fallbacks:
        print(f"    note: pygraphx numpy fallbacks {fallbacks}")
    return lambda feeds: np.asarray(prog.run(feeds)[0])


def ort_engine(path: str, threads: int) -> Callable:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)[0]


def ort_int8_model(src: str, dst: str, calib: list[dict[str, np.ndarray]]) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(calib)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    start = time.perf_counter()
    quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
    print(f"    ORT quantize_static: {time.perf_counter() - start:.1f} s")


def blockwise(engines: dict[str, Callable], feeds: dict, repeat: int) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(2):
        for name, fn in engines.items():
            for _ in range(2):
                fn(feeds)
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                fn(feeds)
                times.append(time.perf_counter() - start)
            ms = statistics.median(times) * 1e3
            best[name] = min(best.get(name, ms), ms)
    return best


def bench_model(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    print(f"{name} (batch {args.batch}, seq {args.seq_len}):", flush=True)
    model = get_model(name, batch=args.batch, seq_len=args.seq_len)
    feeds = model_inputs(name, model, seed=0)
    calib = [model_inputs(name, model, seed=k) for k in range(1, args.calib + 1)]
    fp32_path, int8_path = str(tmp / f"{name}.onnx"), str(tmp / f"{name}.int8.onnx")
    onnx.save(model, fp32_path)
    ort_int8_model(fp32_path, int8_path, calib)
    engines = {
        "pygraphx fp32": pygraphx_engine(model, args.threads, None),
        "pygraphx int8": pygraphx_engine(model, args.threads, calib),
        "ORT fp32": ort_engine(fp32_path, args.threads),
        "ORT int8": ort_engine(int8_path, args.threads),
    }
    outs = {k: fn(feeds) for k, fn in engines.items()}
    ms = blockwise(engines, feeds, args.repeat)
    row = {
        "model": name,
        "ms": ms,
        "pygraphx_int8_speedup_vs_fp32": ms["pygraphx fp32"] / ms["pygraphx int8"],
        "pygraphx_int8_vs_ort_int8": ms["ORT int8"] / ms["pygraphx int8"],
        "rel_rms_pygraphx_int8": rel_rms(outs["pygraphx int8"], outs["pygraphx fp32"]),
        "rel_rms_ort_int8": rel_rms(outs["ORT int8"], outs["ORT fp32"]),
    }
    for k, v in ms.items():
        print(f"    {k:14s} {v:9.1f} ms")
    print(
        f"    int8 speed-up vs fp32 {row['pygraphx_int8_speedup_vs_fp32']:.2f}x, vs ORT int8 "
        f"{row['pygraphx_int8_vs_ort_int8']:.2f}x; rel RMS pygraphx "
        f"{row['rel_rms_pygraphx_int8']:.4f}, ORT {row['rel_rms_ort_int8']:.4f}",
        flush=True,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet50", "bert_base"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--calib", type=int, default=16, help="calibration samples")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench_model(name, args, Path(tmp)) for name in args.models]
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": rows}, indent=2))


if __name__ == "__main__":
    main()
