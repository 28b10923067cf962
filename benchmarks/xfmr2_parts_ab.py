"""A fused projection's column parts as products of their own (`lower_gemm._column_parts`), A/B.

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/xfmr2_parts_ab.py --model bert_base \
        --threads 1 --rounds 12

Two programs in one process: A with the parts off (`PARTS_MIN_ROWS` out of reach: one fused
product, its Q / K / V head views copied dense by the attention step), B as compiled by default
(one product per part, read as they are). Their runs alternate round by round: a plain run
(wall and process CPU time), then a step-by-step run (process CPU time per block, `gemm`,
`attention`, `layernorm`, `views`, `other`). Printed per program: medians over the rounds (and
the fastest), and the largest difference of the outputs from ONNX Runtime's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cpu_transformer_blocks as ctb  # noqa: E402
import numpy as np  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.torch_lowering import lower_gemm  # noqa: E402

BLOCKS = ("gemm", "attention", "layernorm", "views", "other")


def block_cpu(prog: object, feeds: dict) -> dict[str, float]:
    """One step-by-step run: process CPU seconds per block."""
    exe = prog._executable
    kinds = [ctb.pgx_block(s) for s in exe.lowered.steps]
    acc = dict.fromkeys(BLOCKS, 0.0)
    exe.executor.bind(feeds)
    with exe.scope():
        for kind, fn in zip(kinds, exe.executor.steps, strict=True):
            c0 = time.process_time()
            fn()
            acc[kind] = acc.get(kind, 0.0) + time.process_time() - c0
    exe.executor.collect()
    return acc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bert_base")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args(argv)
    args.bf16 = False
    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    data = model.SerializeToString()
    import onnxruntime as ort

    want = ort.InferenceSession(data).run(None, feeds)
    default = lower_gemm.PARTS_MIN_ROWS
    progs, errors = {}, {}
    for name, rows in (("A fused", 1 << 40), ("B parts", default)):
        lower_gemm.PARTS_MIN_ROWS = rows
        progs[name] = ctb.compile_pgx(data, args)
        got = progs[name].run(feeds)
        errors[name] = max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
    lower_gemm.PARTS_MIN_ROWS = default
    runs: dict[str, list] = {k: [] for k in progs}
    blocks: dict[str, list] = {k: [] for k in progs}
    for _ in range(args.rounds):
        for name, prog in progs.items():
            w0, c0 = time.perf_counter(), time.process_time()
            prog.run(feeds)
            runs[name].append((time.perf_counter() - w0, time.process_time() - c0))
            blocks[name].append(block_cpu(prog, feeds))
    print(f"{args.model} b{args.batch} t{args.threads}, {args.rounds} rounds, ms a run: median "
          "(fastest) of the plain run's wall and CPU time, median CPU per block; max |diff| "
          "vs ORT")  # fmt: skip
    for name in progs:
        a = np.array(runs[name]) * 1e3
        cells = "  ".join(f"{np.median(a[:, i]):7.1f} ({a[:, i].min():7.1f})" for i in range(2))
        per = " ".join(f"{b} {np.median([x[b] for x in blocks[name]]) * 1e3:.2f}" for b in BLOCKS)
        print(f"  {name}: {cells} | {per} | {errors[name]:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
