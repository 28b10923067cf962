"""A/B of whole models under environment-variable variants, one process (helper gpt17).

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/gpt17_ab.py --threads 1 --rounds 10 \
        --models gpt2:1 bert_base:1 --variant old: --variant new:PGX_...=1 --steps
    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/gpt17_ab.py --threads 2 --rounds 30 \
        --models gpt2:1 --variant old: --variant new:PGX_...=1 --wait-quiet 120

`benchmarks/gemm14_ab.py`'s harness (each variant compiled with its variables set; runs
alternating one per variant, the order reversed every round: both orders; thread CPU ms at 1
thread, wall ms at more; rel. RMS error against ONNX Runtime float32; `--steps`: per-kind step
times), with what a loaded 2-core machine needs besides the median: each variant's fastest run
and 25th percentile, the median of the per-round ratios (a round's runs are adjacent in time:
they share the machine's state), and with `--steps` each kind's sum of per-step fastest times.
`--openvino`: OpenVINO (bf16 with `--bf16`) as one more variant. `--wait-quiet S`: before each model, wait up to S seconds for /proc/stat busy < 15 % over 2 s.
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
from benchmarks.gemm14_ab import OpenVino, profiled  # noqa: E402
from benchmarks.gemm14_profile import KINDS, pgx_kind  # noqa: E402
from benchmarks.gemm15_ab import wait_quiet  # noqa: E402
from benchmarks.minilm13_ab import compile_prog, parse_variant, rel_err  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["gpt2:1"])
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--steps", action="store_true", help="also per-kind step times")
    ap.add_argument("--wait-quiet", type=float, default=0.0)
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
        if args.wait_quiet:
            print(f"# {spec}: {wait_quiet(args.wait_quiet)}", flush=True)
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
        first = names[0]
        base = float(np.median(times[first]))
        kind = "thread CPU" if args.threads == 1 else "wall"
        print(f"{spec} t{args.threads} {'bf16' if args.bf16 else 'f32'}, {args.rounds} rounds, "
              f"{kind} ms: median (ratio to {first}), p25, min, median of per-round ratios; "
              "rel RMS err vs ORT f32; loadavg "
              f"{Path('/proc/loadavg').read_text().split()[0]}")  # fmt: skip
        for n in names:
            t = np.array(times[n])
            m = float(np.median(t))
            paired = float(np.median(t / np.array(times[first])))
            print(f"  {n:10s} {m * 1e3:9.2f} ({m / base:.3f})  p25 {np.percentile(t, 25) * 1e3:9.2f}"
                  f"  min {t.min() * 1e3:9.2f}  paired {paired:.3f}  {errs[n]:.1e}  "
                  f"{dict(variants).get(n, 'OpenVINO')}")  # fmt: skip
        if args.steps:
            med: dict[str, dict[str, float]] = {}
            fast: dict[str, dict[str, float]] = {}
            names = [n for n in names if n != "OV"]
            for n in names:
                arr = np.array(steps[n])
                for out, col in ((med, np.median(arr, axis=0)), (fast, arr.min(axis=0))):
                    acc: dict[str, float] = defaultdict(float)
                    for st, t in zip(progs[n]._executable.lowered.steps, col, strict=True):
                        acc[pgx_kind(st)] += t
                    out[n] = acc
            print("  kind        " + " ".join(f"{n:>10s}" for n in names) + "  (ms a run, each "
                  "step's median) | (each step's fastest)")  # fmt: skip
            for k in (*KINDS, "sum"):
                row = []
                for table in (med, fast):
                    row += [sum(table[n].values()) if k == "sum" else table[n].get(k, 0.0)
                            for n in names]  # fmt: skip
                if any(row):
                    half = len(names)
                    print(f"  {k:10s} " + " ".join(f"{v * 1e3:10.2f}" for v in row[:half])
                          + " | " + " ".join(f"{v * 1e3:10.2f}" for v in row[half:]))
        sys.stdout.flush()
    print("# loadavg at the end:", Path("/proc/loadavg").read_text().split()[:3])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
