"""A/B in one process: transformer GEMMs on torch's oneDNN linear (A) against oneDNN's matmul
primitive through its C API (B, the default; `PGX_CPU_DNNL_GEMM`).

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/xf11_gemm_ab.py --model bert_base \
        --threads 2 --rounds 20 [--bf16]

A is compiled with `PGX_CPU_DNNL_GEMM=torch` (with `--parts`: the C API, Q / K / V one product
per part instead of one batched product; with `--fresh`: `PGX_CPU_FRESH_OUTPUT=0`, a returned
bf16 product's float32 group in its arena slot, copied out by each run, gpt12), B as the tree
compiles it. The programs run in
turn (A B, then B A); each round times one plain run of each (`prog.run`, wall; process CPU
too) and one run with its steps timed (`attn10_ab.timed_run`: thread CPU time at one thread,
wall otherwise). Printed: medians over the rounds of the plain runs and of the blocks, and the
largest differences between the outputs and from ONNX Runtime's (float32).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: its tree wins

import cpu_transformer_blocks as ctb  # noqa: E402
from attn10_ab import model_and_feeds, timed_run  # noqa: E402

from pygraphx.targets.torch_lowering.gemm_kernels import DNNL_GEMM_ENV  # noqa: E402
from pygraphx.targets.torch_lowering.lower_gemm import FRESH_ENV  # noqa: E402

MODELS = ("bert_base", "gpt2")
#: (--parts, --fresh) -> what A and B are
LABELS = {
    (False, False): ("torch linear", "C API matmul"),
    (True, False): ("per-part products", "one batched product"),
    (False, True): ("output in its arena slot, copied", "output a new tensor"),
}


def compile_with(
    data: bytes, args: argparse.Namespace, setting: str, env: str = DNNL_GEMM_ENV
) -> Any:
    """The program compiled with `env=setting` (`PGX_CPU_DNNL_GEMM` unless told)."""
    before = os.environ.get(env)
    os.environ[env] = setting
    try:
        return ctb.compile_pgx(data, args)
    finally:
        if before is None:
            del os.environ[env]
        else:
            os.environ[env] = before


def compile_per_part(data: bytes, args: argparse.Namespace) -> Any:
    """The program with Q / K / V as one product per part (no batched product)."""
    from pygraphx.targets.torch_lowering import lower_gemm

    batched = lower_gemm._batched_parts
    lower_gemm._batched_parts = lambda *_: None
    try:
        return compile_with(data, args, "matmul")
    finally:
        lower_gemm._batched_parts = batched


def rounds(progs: dict, feeds: dict, args: argparse.Namespace) -> tuple[dict, dict]:
    """Per program: lists of the plain runs' wall / CPU ms and the blocks' ms, and outputs."""
    clock = time.thread_time_ns if args.threads == 1 else time.perf_counter_ns
    blocks = {n: [ctb.pgx_block(s) for s in p._executable.lowered.steps] for n, p in progs.items()}
    sums: dict[str, dict[str, list[float]]] = {n: {} for n in progs}
    outs: dict[str, list] = {}
    for _ in range(2):
        for prog in progs.values():
            prog.run(feeds)
    for r in range(args.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            cells = sums[name]
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            cpu, start = ctb.cpu_seconds(), time.perf_counter()
            progs[name].run(feeds)
            cells.setdefault("run wall", []).append((time.perf_counter() - start) * 1e3)
            cells.setdefault("run CPU", []).append((ctb.cpu_seconds() - cpu) * 1e3)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            cells.setdefault("run faults", []).append(float(faults))
            times, _, outs[name] = timed_run(progs[name], feeds, clock)
            for b in set(blocks[name]):
                mine = [t for t, x in zip(times, blocks[name], strict=True) if x == b]
                cells.setdefault(b, []).append(sum(mine) / 1e6)
    return sums, outs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bert_base", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--parts", action="store_true",
                    help="A: Q / K / V one product per part (B: one batched product)")  # fmt: skip
    ap.add_argument("--fresh", action="store_true",
                    help="A: a returned bf16 group in its arena slot (B: new tensors)")  # fmt: skip
    args = ap.parse_args(argv)
    import onnxruntime as ort

    data, feeds = model_and_feeds(args.model, args.threads, args.batch)
    if args.fresh:
        first = compile_with(data, args, "0", FRESH_ENV)
    else:
        first = compile_per_part(data, args) if args.parts else compile_with(data, args, "torch")
    progs = {"A": first, "B": compile_with(data, args, "matmul")}
    sums, outs = rounds(progs, feeds, args)
    want = ort.InferenceSession(data).run(None, feeds)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(outs["A"], outs["B"], strict=True))
    errs = {n: max(float(np.abs(o - w).max()) for o, w in zip(outs[n], want, strict=True))
            for n in outs}  # fmt: skip
    precision = "bf16" if args.bf16 else "float32"
    a_is, b_is = LABELS[args.parts, args.fresh]
    print(f"{args.model} b{args.batch} {precision} t{args.threads}, {args.rounds} rounds, ms, "
          f"median: A ({a_is}) / B ({b_is}); outputs A vs B {diff:.1e}, vs ORT "
          f"A {errs['A']:.1e} B {errs['B']:.1e}")  # fmt: skip
    for b in sorted(sums["A"]):
        a, bb = np.median(sums["A"][b]), np.median(sums["B"][b])
        rel = f"{(bb - a) / a * 100:+.1f}%" if a else "-"
        print(f"  {b:10s} {a:8.2f} / {bb:8.2f}  ({bb - a:+.2f}, {rel})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
