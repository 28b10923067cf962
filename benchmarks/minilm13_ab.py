"""A/B of whole models under environment-variable variants, one process (helper minilm13).

    PYTHONPATH=. python benchmarks/minilm13_ab.py --threads 2 --rounds 20 \
        --models minilm vit_b16 bert_base:1 --variant A: --variant B:PGX_CPU_GEMM=mkl

A wrapper of `benchmarks/ab_harness.py` (the one harness; its docstring says what is printed):
each `--variant NAME:ENV=VAL,ENV=VAL` compiles every model (float32, or `--bf16`) with those
variables set during parse + compile; the runs alternate one per variant, the order reversed
every round; each variant's median ms (wall at 2+ threads, thread CPU time at 1 thread), its
ratio to the first variant, and its rel. RMS error against ONNX Runtime float32 (the oracle).
`compile_prog`, `parse_variant`, `rel_err` stay importable from here (gemm14_bf16_error.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402
from benchmarks.ab_harness import rel_err  # noqa: E402,F401


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    v = ab.parse_variant(text)
    return v.name, v.env


def compile_prog(data: bytes, threads: int, env: dict[str, str], bf16: bool):
    return ab.compile_variant(ab.Case("", data, {}), threads, ab.Variant("", env, bf16))


def main(argv: list[str] | None = None) -> int:
    return ab.main(argv, description=__doc__.splitlines()[0], models=["minilm"])


if __name__ == "__main__":
    raise SystemExit(main())
