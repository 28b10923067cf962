"""A fused projection's column parts as products of their own (`lower_gemm._column_parts`), A/B.

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/xfmr2_parts_ab.py --model bert_base \
        --threads 1 --rounds 12

Two programs in one process: A with the parts off (`PARTS_MIN_ROWS` out of reach: one fused
product, its Q / K / V head views copied dense by the attention step; the setting
`@lower_gemm.PARTS_MIN_ROWS=2**40` while it compiles), B as compiled by default (one product per
part, read as they are). A wrapper of `benchmarks/ab_harness.py` (the one harness, `--steps`
always on, steps grouped by `cpu_transformer_blocks.pgx_block`: `gemm`, `attention`,
`layernorm`, `views`, `other`): plain runs alternate round by round (both orders), then
step-by-step runs. Printed per program: medians over the rounds (and the fastest), process CPU,
per block, and the difference of the outputs from ONNX Runtime's.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cpu_transformer_blocks as ctb  # noqa: E402

from benchmarks import ab_harness as ab  # noqa: E402

VARIANTS = [ab.Variant("A fused", {"@lower_gemm.PARTS_MIN_ROWS": str(1 << 40)}),
            ab.Variant("B parts")]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=[], threads=1, rounds=12, env_options=False)
    p.add_argument("--model", default="bert_base")
    p.add_argument("--batch", type=int, default=1)
    args = p.parse_args(argv)
    cfgs = [replace(c, steps=True, kind_of=ctb.pgx_block) for c in ab.configs_of(args)]
    return ab.run(args.models or [f"{args.model}:{args.batch}"], VARIANTS, cfgs, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
