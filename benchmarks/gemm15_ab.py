"""A/B of whole models under environment-variable variants, one process (helper gemm15).

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/gemm15_ab.py --threads 2 --rounds 20 \
        --bf16 --models bert_base:1 --variant old:PGX_CPU_GEMM_RESIDUAL_BF16=0 --variant new: \
        --openvino --wait-quiet 120

A wrapper of `benchmarks/ab_harness.py` (the one harness: each variant compiled with its
variables set; runs alternating one per variant, the order reversed every round: both orders;
median wall ms at 2+ threads, thread CPU ms at 1 thread; rel. RMS error against ONNX Runtime
float32; `--steps`, `--openvino`, and `--wait-quiet S`: before each model's timing, wait up to
S seconds for a quiet moment (/proc/stat busy < 15 % over 2 s) and say whether one came).
`busy` and `wait_quiet` stay importable here.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402
from benchmarks.ab_harness import busy, wait_quiet  # noqa: E402,F401


def main(argv: list[str] | None = None) -> int:
    return ab.main(argv, description=__doc__.splitlines()[0], models=["minilm"])


if __name__ == "__main__":
    raise SystemExit(main())
