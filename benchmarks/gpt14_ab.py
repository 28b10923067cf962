"""A/B in one process: GPT-2 with causal key-block skipping in the native attention kernel (B)
against the full kernel reading the causal mask (A, `PGX_CPU_NATIVE_ATTENTION_CAUSAL=0`).

    PYTHONPATH=. python benchmarks/gpt14_ab.py --threads 2 --batches 1 8 --rounds 12
    PYTHONPATH=. python benchmarks/gpt14_ab.py --threads 1 --batches 1 --rounds 8 --bf16

Per batch: GPT-2 (the built-in one, s128, attention_mask all ones) compiled twice, float32 (or
bf16 with `--bf16`: `quantize_bf16`'s default policy), A with the switch off and B with it on
(the switch is read when a block is lowered). Runs alternate A B in even rounds, B A in odd
ones, after two warm-up runs each; printed: the median run (thread CPU time at one thread, wall
at more), B/A, the A vs B max output difference (0 expected: the kernel's weights of masked
keys are exactly 0 either way), each one's relative RMS error against ONNX Runtime float32, and
whether the machine was quiet before (the first field of /proc/loadavg).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: its tree wins

import pygraphx  # noqa: E402  (before torch: it sets OpenMP's spin count)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from pygraphx.targets.torch_lowering import native_attention  # noqa: E402


def compile_prog(data: bytes, threads: int, causal: bool, bf16: bool):
    from pygraphx.targets.cpu.target import CpuTarget

    env = native_attention.CAUSAL_ENV
    old = os.environ.get(env)
    os.environ[env] = "1" if causal else "0"
    try:
        prog = pygraphx.parse_onnx_buffer(data)
        if bf16:
            pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=threads))
    finally:
        if old is None:
            del os.environ[env]
        else:
            os.environ[env] = old
    return prog


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--no-ort", action="store_true", help="skip the ORT error check")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from pygraphx.models import get_model, model_inputs

    clock = time.thread_time if args.threads == 1 else time.perf_counter
    for batch in args.batches:
        model = get_model("gpt2", batch=batch)
        data, feeds = model.SerializeToString(), model_inputs("gpt2", model)
        want = None
        if not args.no_ort:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = args.threads
            sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
            want = sess.run(None, feeds)
            del sess
        progs = {"A": compile_prog(data, args.threads, False, args.bf16),
                 "B": compile_prog(data, args.threads, True, args.bf16)}  # fmt: skip
        outs = {n: [np.array(o) for o in p.run(feeds)] for n, p in progs.items()}
        for p in progs.values():
            p.run(feeds)
        quiet = loadavg()
        times: dict[str, list[float]] = {"A": [], "B": []}
        for r in range(args.rounds):
            for n in ("A", "B") if r % 2 == 0 else ("B", "A"):
                start = clock()
                progs[n].run(feeds)
                times[n].append(clock() - start)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(outs["A"], outs["B"], strict=True))

        def err(got: list[np.ndarray]) -> str:
            if want is None:
                return "-"
            num = sum(float(((g.astype(np.float64) - w) ** 2).sum()) for g, w in zip(got, want))
            den = sum(float((w.astype(np.float64) ** 2).sum()) for w in want)
            return f"{(num / den) ** 0.5:.1e}"

        a, b = np.median(times["A"]) * 1e3, np.median(times["B"]) * 1e3
        # each round's B - A (adjacent runs): robust to the load drifting between rounds
        paired = np.median(np.subtract(times["B"], times["A"])) * 1e3
        print(f"gpt2 b{batch} t{args.threads} {'bf16' if args.bf16 else 'f32'}, {args.rounds} "
              f"rounds, {'thread CPU' if args.threads == 1 else 'wall'} ms median: A (full) "
              f"{a:.2f} / B (causal) {b:.2f} (B/A {b / a:.3f}, B-A {b - a:+.2f}, median of rounds' "
              f"B-A {paired:+.2f}); A vs B max diff "
              f"{diff:.1e}; rel RMS err vs ORT f32 A {err(outs['A'])}, B {err(outs['B'])}; "
              f"loadavg before {quiet}, after {loadavg()}", flush=True)  # fmt: skip
        del progs, outs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
