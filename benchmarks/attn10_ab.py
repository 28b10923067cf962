"""A/B in one process: this tree's layer-norm steps against their earlier calls.

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/attn10_ab.py --model bert_base \
        --threads 1 --rounds 20

A is compiled with the call the layer-norm steps made before (`F.layer_norm`, its Python
wrapper, where B calls `torch.layer_norm`); B as the tree compiles it. The two programs run in
turn (A B, then B A), each step timed inside its run (thread CPU time at one thread, wall
otherwise). Printed: per block the median over rounds of each program's sum, the run, and the
largest difference between the programs' outputs and from ONNX Runtime's.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: its tree wins

import cpu_transformer_blocks as ctb  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402


def compile_a(data: bytes, threads: int) -> Any:
    """The program with the earlier calls (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    real_norm = torch.layer_norm
    torch.layer_norm = F.layer_norm  # bound by the lowering; F calls the real one at run time
    try:
        return compile_b(data, threads)
    finally:
        torch.layer_norm = real_norm


def compile_b(data: bytes, threads: int) -> Any:
    prog = pygraphx.parse_onnx_buffer(data)
    prog.compile(CpuTarget(threads=threads))
    return prog


def timed_run(prog: Any, feeds: dict, clock: Callable[[], int]) -> tuple[np.ndarray, float, list]:
    """One run with each step timed: (step times, the run's time, the outputs)."""
    exe = prog._executable
    times = np.zeros(len(exe.executor.steps))
    start = clock()
    exe.executor.bind(feeds)
    with exe.scope():
        for i, fn in enumerate(exe.executor.steps):
            t0 = clock()
            fn()
            times[i] = clock() - t0
    outs = [np.array(o, copy=True) for o in exe.executor.collect()]
    return times, clock() - start, outs


def model_and_feeds(name: str, threads: int, batch: int = 1) -> tuple[bytes, dict]:
    """A built-in model's bytes and inputs, torch set to `threads`."""
    import torch

    torch.set_num_threads(threads)
    model = get_model(name, batch=batch)
    return model.SerializeToString(), model_inputs(name, model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bert_base", choices=["bert_base", "gpt2"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    import onnxruntime as ort

    clock = time.thread_time_ns if args.threads == 1 else time.perf_counter_ns
    data, feeds = model_and_feeds(args.model, args.threads)
    progs = {"A": compile_a(data, args.threads), "B": compile_b(data, args.threads)}
    blocks = {n: [ctb.pgx_block(s) for s in p._executable.lowered.steps] for n, p in progs.items()}
    sums: dict[str, dict[str, list[float]]] = {n: {} for n in progs}
    outs: dict[str, list] = {}
    for _ in range(2):
        for prog in progs.values():
            prog.run(feeds)
    for r in range(args.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            times, whole, outs[name] = timed_run(progs[name], feeds, clock)
            cells = sums[name]
            cells.setdefault("run", []).append(whole / 1e6)
            for b in set(blocks[name]):
                mine = [t for t, x in zip(times, blocks[name], strict=True) if x == b]
                cells.setdefault(b, []).append(sum(mine) / 1e6)
    want = ort.InferenceSession(data).run(None, feeds)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(outs["A"], outs["B"], strict=True))
    err = max(float(np.abs(a - w).max()) for a, w in zip(outs["B"], want, strict=True))
    clock_name = "thread CPU" if args.threads == 1 else "wall"
    print(f"{args.model} b1 t{args.threads}, {args.rounds} rounds, {clock_name} ms, median: A / B; "
          f"outputs A vs B {diff:.1e}, B vs ORT {err:.1e}")  # fmt: skip
    for b in sorted(sums["A"]):
        a, bb = np.median(sums["A"][b]), np.median(sums["B"][b])
        print(f"  {b:10s} {a:8.2f} / {bb:8.2f}  ({bb - a:+.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
