"""A/B of GPT-2 float32 (and BERT-base as a check) under helper gpt16's switches, one process.

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/gpt16_ab.py --threads 1 --rounds 20 \
        --models gpt2:1 gpt2:8 bert_base:1 --steps
    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/gpt16_ab.py --threads 2 --rounds 30 \
        --models gpt2:1 --wait-quiet 120

A wrapper of `benchmarks/ab_harness.py` (variants compiled with their variables set, runs
alternating, the order reversed every round: both orders; median wall ms at 2+ threads, thread
CPU ms at 1 thread; rel. RMS error against ONNX Runtime float32; `--wait-quiet S` before each
model's timing). Without `--variant` / `--old` / `--new`, the variants are `old`
(`PGX_CPU_LAYERNORM_SLOT=0`: the norms write a new tensor each run) and `new` (the default: a
float32 norm's native kernel writes its arena slot, `layernorm._slot`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return ab.main(argv, description=__doc__.splitlines()[0], models=["minilm"],
                   old={"PGX_CPU_LAYERNORM_SLOT": "0"})  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
