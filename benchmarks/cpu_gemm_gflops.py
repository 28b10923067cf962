"""GFLOP/s of a transformer's weight GEMMs on the `cpu` target, oneDNN against MKL, by CPU time.

    python benchmarks/cpu_gemm_gflops.py                        # bert_base, batch 1, 1 thread
    python benchmarks/cpu_gemm_gflops.py --model gpt2 --batch 8 --threads 4

Compiles the built-in model twice (`CpuTarget(mkldnn=False, attention=False, layernorm=False)`,
the GEMMs through MKL's packed weights as before this change, and the default: oneDNN with
the bias and GELU inside the GEMM, fused attention and layer normalisation), then runs the fast
path's steps one by one, alternating the two programs, and sums the process CPU time of the
steps that are one GEMM with a fixed weight (with its bias / epilogue). CPU time, not wall time,
so the figure holds on a machine shared with other work; with more than one thread it includes
every thread's time (and any spinning), so GFLOP/s is per core-second there.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402

VARIANTS = {
    "mkl": {"mkldnn": False, "attention": False, "layernorm": False},
    "onednn": {},
}


def weight_gemm_flops(step) -> int:
    """FLOPs of a step that computes exactly one product with a fixed right-hand side."""
    dots = [i for i in step.instructions if i.op.name == "dot"]
    if len(dots) != 1 or step.instructions[0] is not dots[0]:
        return 0
    w = dots[0].inputs[1]
    while w.op.name == "multibroadcast":
        w = w.inputs[0]
    if not w.is_literal():
        return 0
    return 2 * dots[0].shape.elements() * dots[0].inputs[0].shape.lens()[-1]


def step_cpu_seconds(prog, feeds, runs: int) -> list[float]:
    exe = prog._executable
    fns = exe.executor.steps
    cpu = [0.0] * len(fns)
    for _ in range(runs):
        exe.executor.bind(feeds)
        with exe.scope():
            for k, fn in enumerate(fns):
                start = time.process_time()
                fn()
                cpu[k] += time.process_time() - start
    return [c / runs for c in cpu]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert_base", choices=("bert_base", "gpt2"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    progs = {}
    for name, settings in VARIANTS.items():
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        prog.compile(CpuTarget(threads=args.threads, **settings))
        prog.run(feeds)
        progs[name] = prog
    print(f"{args.model} batch {args.batch}, {args.threads} thread(s), CPU time per run")
    for _ in range(args.rounds):
        for name, prog in progs.items():
            cpu = step_cpu_seconds(prog, feeds, args.runs)
            flops = [weight_gemm_flops(s) for s in prog._executable.lowered.steps]
            gemm = sum(c for c, f in zip(cpu, flops, strict=True) if f)
            n = sum(1 for f in flops if f)
            print(
                f"  {name:7s} {n} weight GEMMs: {gemm * 1e3:.1f} ms, {sum(flops) / 1e9:.2f} GFLOP, "
                f"{sum(flops) / gemm / 1e9:.0f} GFLOP/s; whole run {sum(cpu) * 1e3:.1f} ms"
            )


if __name__ == "__main__":
    main()
