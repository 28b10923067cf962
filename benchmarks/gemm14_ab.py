"""A/B of whole models under environment-variable variants, one process (helper gemm14).

    PYTHONPATH=. python benchmarks/gemm14_ab.py --threads 1 --rounds 20 \
        --models minilm bert_base:1 --variant old:PGX_CPU_LAYERNORM_F32=torch --variant new:

`benchmarks/minilm13_ab.py`'s harness (each variant compiled with its variables set; runs
alternating one per variant, the order reversed every round; median wall ms at 2+ threads,
thread CPU ms at 1 thread; rel. RMS error against ONNX Runtime float32), plus `--steps`:
as many profiled rounds (each step timed alone, same alternation), printed as ms a run per
kind of step (`gemm14_profile.pgx_kind`), each step's median. `--openvino`: OpenVINO (f32, or
bf16 with `--bf16`; one stream, the same threads) runs as one more variant in the alternation.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attn13_ab import load  # noqa: E402
from benchmarks.gemm14_profile import KINDS, pgx_kind  # noqa: E402
from benchmarks.minilm13_ab import compile_prog, parse_variant, rel_err  # noqa: E402


def profiled(prog, feeds, clock) -> list[float]:
    exe = prog._executable
    out = []
    exe.executor.bind(feeds)
    with exe.scope():
        for fn in exe.executor.steps:
            start = clock()
            fn()
            out.append(clock() - start)
    exe.executor.collect()
    return out


class OpenVino:
    """OpenVINO's compiled model with a `run(feeds)` like a program's."""

    def __init__(self, data: bytes, threads: int, bf16: bool) -> None:
        import tempfile

        import openvino as ov

        path = Path(tempfile.mkdtemp()) / "model.onnx"
        path.write_bytes(data)
        config = {"INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32",
                  "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1}  # fmt: skip
        core = ov.Core()
        self.request = core.compile_model(core.read_model(str(path)), "CPU", config)
        self.request = self.request.create_infer_request()

    def run(self, feeds: dict) -> list:
        result = self.request.infer(feeds)
        return [np.asarray(v) for v in result.values()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["minilm"])
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--steps", action="store_true", help="also per-kind step times")
    ap.add_argument("--openvino", action="store_true", help="OpenVINO as one more variant")
    args = ap.parse_args(argv)
    import onnxruntime as ort
    import torch

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    variants = [parse_variant(v) for v in args.variant]
    print("# loadavg at the start:", Path("/proc/loadavg").read_text().split()[:3])
    for spec in args.models:
        data, feeds = load(spec)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        want = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"]).run(None, feeds)
        progs = {n: compile_prog(data, args.threads, env, args.bf16) for n, env in variants}
        if args.openvino:
            progs["OV"] = OpenVino(data, args.threads, args.bf16)
        errs = {n: rel_err([np.array(o) for o in p.run(feeds)], want) for n, p in progs.items()}
        for p in progs.values():
            p.run(feeds)
        names = list(progs)
        times: dict[str, list[float]] = {n: [] for n in names}
        steps: dict[str, list[list[float]]] = {n: [] for n in names}
        for r in range(args.rounds):
            for n in names if r % 2 == 0 else names[::-1]:
                start = clock()
                progs[n].run(feeds)
                times[n].append(clock() - start)
                if args.steps and n != "OV":
                    steps[n].append(profiled(progs[n], feeds, clock))
        base = float(np.median(times[names[0]]))
        kind = "thread CPU" if args.threads == 1 else "wall"
        print(f"{spec} t{args.threads} {'bf16' if args.bf16 else 'f32'}, {args.rounds} rounds, "
              f"{kind} ms median (ratio to {names[0]}; rel RMS err vs ORT f32):")
        for n in names:
            m = float(np.median(times[n]))
            env = dict(variants).get(n, "OpenVINO")
            print(f"  {n:10s} {m * 1e3:9.2f}  {m / base:.3f}  {errs[n]:.1e}  {env}")
        if args.steps:
            per = {}
            names = [n for n in names if n != "OV"]
            for n in names:
                med = np.median(np.array(steps[n]), axis=0)
                acc: dict[str, float] = defaultdict(float)
                for st, t in zip(progs[n]._executable.lowered.steps, med, strict=True):
                    acc[pgx_kind(st)] += t
                per[n] = acc
            print("  kind        " + " ".join(f"{n:>10s}" for n in names) + "  (ms a run, "
                  "each step's median)")  # fmt: skip
            for k in (*KINDS, "sum"):
                vals = [sum(per[n].values()) if k == "sum" else per[n].get(k, 0.0) for n in names]
                if any(vals):
                    print(f"  {k:10s} " + " ".join(f"{v * 1e3:10.2f}" for v in vals))
        sys.stdout.flush()
    print("# loadavg at the end:", Path("/proc/loadavg").read_text().split()[:3])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
