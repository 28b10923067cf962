"""mnv15's switches on a many-core host: MobileNetV2 float32 at batch 1 and 8, each switch off
against everything on, one process, alternating blocks (the order reversed every round), the
best block of each program (and the median), one table (and `--json`).

    python benchmarks/mnv15_probe16.py --threads 16 [--rounds 6] [--runs 10] [--json FILE]

Programs: "new" (the defaults), "head off" (PGX_CPU_NATIVE_MBHEAD=0: the 1x1 320->1280,
the pooling and the classifier on the library route), "stem off" (PGX_CPU_NATIVE_MBSTEM=0: the
first 3x3 convolution its own oneDNN step), "both off" (the route before mnv15), and
"mbconv off" (PGX_CPU_NATIVE_MBCONV=0: every block on oneDNN too, for scale). Each is checked
against ONNX Runtime once; ORT's own time (same threads) is printed beside. Meant to finish in
under a minute at 16 threads (compiles dominate: five programs a batch).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnv2b1_ab import compiled  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402

VARIANTS = {
    "new": {},
    "head off": {"PGX_CPU_NATIVE_MBHEAD": "0"},
    "stem off": {"PGX_CPU_NATIVE_MBSTEM": "0"},
    "both off": {"PGX_CPU_NATIVE_MBHEAD": "0", "PGX_CPU_NATIVE_MBSTEM": "0"},
    "mbconv off": {"PGX_CPU_NATIVE_MBHEAD": "0", "PGX_CPU_NATIVE_MBSTEM": "0",
                   "PGX_CPU_NATIVE_MBCONV": "0"},
}  # fmt: skip


def ort_session(model, threads: int):  # noqa: ANN001, ANN201
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def probe(batch: int, threads: int, rounds: int, runs: int) -> dict:
    model = get_model("mobilenetv2", batch=batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs("mobilenetv2", model).items()}
    sess = ort_session(model, threads)
    want = sess.run(None, feeds)[0]
    progs = {name: compiled(model, threads, env) for name, env in VARIANTS.items()}
    diffs = {}
    for name, prog in progs.items():
        diffs[name] = float(np.abs(np.asarray(prog.run(feeds)[0]) - want).max())
        prog.run(feeds)
    times: dict[str, list[float]] = {name: [] for name in [*progs, "ort"]}
    order = [*progs.items(), ("ort", None)]
    for r in range(rounds):
        for name, prog in order if r % 2 == 0 else order[::-1]:
            fn = (lambda: sess.run(None, feeds)) if prog is None else (lambda p=prog: p.run(feeds))
            fn()
            t0 = time.perf_counter()
            for _ in range(runs):
                fn()
            times[name].append((time.perf_counter() - t0) / runs * 1e3)
    return {
        name: {"best_ms": round(min(v), 3), "median_ms": round(float(np.median(v)), 3),
               "max_abs_diff_vs_ort": diffs.get(name, 0.0)}
        for name, v in times.items()
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--runs", type=int, default=10, help="runs a block at batch 1 (batch 8: /4)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    start = time.monotonic()
    out = {}
    for b in args.batches:
        out[b] = probe(b, args.threads, args.rounds, max(2, args.runs // (4 if b > 1 else 1)))
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"MobileNetV2 f32, {args.threads} threads, {args.rounds} rounds, load {load}, "
          f"{time.monotonic() - start:.0f} s")  # fmt: skip
    print("| batch | program | best ms | median ms | best / new | best / ORT | max diff vs ORT |")
    print("|---|---|---|---|---|---|---|")
    for b, rows in out.items():
        new, ort_best = rows["new"]["best_ms"], rows["ort"]["best_ms"]
        for name, r in rows.items():
            print(f"| {b} | {name} | {r['best_ms']:.3f} | {r['median_ms']:.3f} | "
                  f"{r['best_ms'] / new:.3f} | {r['best_ms'] / ort_best:.3f} | "
                  f"{r['max_abs_diff_vs_ort']:.1e} |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "load": load, "results": out},
                                              indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
