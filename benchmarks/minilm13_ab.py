"""A/B of whole models under environment-variable variants, one process (helper minilm13).

    PYTHONPATH=. python benchmarks/minilm13_ab.py --threads 2 --rounds 20 \
        --models minilm vit_b16 bert_base:1 --variant A: --variant B:PGX_CPU_GEMM=mkl

Each `--variant NAME:ENV=VAL,ENV=VAL` compiles every model (float32, or `--bf16`) with those
variables set during parse + compile (and restored after); the runs then alternate blocks of
one run per variant, the order reversed every round (A B, B A, ...). Prints each variant's
median ms (wall at 2+ threads, thread CPU time at 1 thread), its ratio to the first variant,
and its rel. RMS error against ONNX Runtime float32 (the oracle).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attn13_ab import load  # noqa: E402


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition(":")
    env = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return name, env


def compile_prog(data: bytes, threads: int, env: dict[str, str], bf16: bool):
    import pygraphx
    from pygraphx.targets.cpu.target import CpuTarget

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        prog = pygraphx.parse_onnx_buffer(data)
        if bf16:
            pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=threads))
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    return prog


def rel_err(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    num = sum(float(((g.astype(np.float64) - w) ** 2).sum()) for g, w in zip(got, want))
    return (num / sum(float((w.astype(np.float64) ** 2).sum()) for w in want)) ** 0.5


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["minilm"])
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--bf16", action="store_true")
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
        errs = {n: rel_err([np.array(o) for o in p.run(feeds)], want) for n, p in progs.items()}
        for p in progs.values():
            p.run(feeds)
        names = list(progs)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for n in names if r % 2 == 0 else names[::-1]:
                start = clock()
                progs[n].run(feeds)
                times[n].append(clock() - start)
        base = float(np.median(times[names[0]]))
        kind = "thread CPU" if args.threads == 1 else "wall"
        print(f"{spec} t{args.threads} {'bf16' if args.bf16 else 'f32'}, {args.rounds} rounds, "
              f"{kind} ms median (ratio to {names[0]}; rel RMS err vs ORT f32):")
        for n in names:
            m = float(np.median(times[n]))
            print(f"  {n:10s} {m * 1e3:9.2f}  {m / base:.3f}  {errs[n]:.1e}  {dict(variants)[n]}")
        sys.stdout.flush()
    print("# loadavg at the end:", Path("/proc/loadavg").read_text().split()[:3])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
