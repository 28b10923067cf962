"""A/B in one process: transformer GEMMs on torch's oneDNN linear (A) against oneDNN's matmul
primitive through its C API (B, the default; `PGX_CPU_DNNL_GEMM`).

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/xf11_gemm_ab.py --model bert_base \
        --threads 2 --rounds 20 [--bf16]

A is compiled with `PGX_CPU_DNNL_GEMM=torch` (with `--parts`: the C API, Q / K / V one product
per part instead of one batched product; with `--fresh`: `PGX_CPU_FRESH_OUTPUT=0`, a returned
bf16 product's float32 group in its arena slot, copied out by each run, gpt12), B as the tree
compiles it. A wrapper of `benchmarks/ab_harness.py` (the one harness, `--steps` always on,
steps grouped by `cpu_transformer_blocks.pgx_block`): the programs run in turn (A B, then B A),
plain runs (thread CPU time at one thread, wall otherwise; process CPU too), then runs with
their steps timed. Printed: medians over the rounds of the plain runs and of the blocks, the
differences between the outputs and from ONNX Runtime's (float32); kept here: the minor page
faults a run.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: its tree wins

import cpu_transformer_blocks as ctb  # noqa: E402

from benchmarks import ab_harness as ab  # noqa: E402

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


def faults(progs: dict, case: ab.Case, cfg: ab.Config, out) -> dict:
    """Minor page faults a run, median over `cfg.rounds` runs of each (alternating)."""
    got: dict[str, list[int]] = {n: [] for n in progs}
    for r in range(cfg.rounds):
        for n in list(progs) if r % 2 == 0 else list(progs)[::-1]:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            progs[n].run(case.feeds)
            got[n].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    med = {n: float(np.median(v)) for n, v in got.items()}
    cells = ", ".join(f"{n} {v:.0f}" for n, v in med.items())
    print(f"  minor page faults a run (median): {cells}", file=out)
    return med


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=[], threads=1, rounds=20, warmup=2,
                  env_options=False)  # fmt: skip
    p.add_argument("--model", default="bert_base", choices=MODELS)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--parts", action="store_true",
                   help="A: Q / K / V one product per part (B: one batched product)")  # fmt: skip
    p.add_argument("--fresh", action="store_true",
                   help="A: a returned bf16 group in its arena slot (B: new tensors)")  # fmt: skip
    args = p.parse_args(argv)
    a_is, b_is = LABELS[args.parts, args.fresh]

    def first(case: ab.Case, threads: int) -> Any:
        opts = argparse.Namespace(bf16=args.bf16, threads=threads)
        if args.fresh:
            return compile_with(case.data, opts, "0", FRESH_ENV)
        if args.parts:
            return compile_per_part(case.data, opts)
        return compile_with(case.data, opts, "torch")

    def second(case: ab.Case, threads: int) -> Any:
        return compile_with(case.data, argparse.Namespace(bf16=args.bf16, threads=threads),
                            "matmul")  # fmt: skip

    variants = [ab.Variant("A", bf16=args.bf16, build=first, label=a_is),
                ab.Variant("B", bf16=args.bf16, build=second, label=b_is)]  # fmt: skip
    cfgs = [replace(c, steps=True, kind_of=ctb.pgx_block) for c in ab.configs_of(args)]
    return ab.run([f"{args.model}:{args.batch}"], variants, cfgs, args.json, extra=faults)


if __name__ == "__main__":
    raise SystemExit(main())
