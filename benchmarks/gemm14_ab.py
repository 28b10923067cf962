"""A/B of whole models under environment-variable variants, one process (helper gemm14).

    PYTHONPATH=. python benchmarks/gemm14_ab.py --threads 1 --rounds 20 \
        --models minilm bert_base:1 --variant old:PGX_CPU_LAYERNORM_F32=torch --variant new:

A wrapper of `benchmarks/ab_harness.py` (the one harness: each variant compiled with its
variables set; runs alternating one per variant, the order reversed every round; median wall
ms at 2+ threads, thread CPU ms at 1 thread; rel. RMS error against ONNX Runtime float32):
`--steps` (each step timed alone, printed as ms a run per kind of step,
`gemm14_profile.pgx_kind`) and `--openvino` (OpenVINO f32, or bf16 with `--bf16`, one more
variant in the alternation) are the harness's. `profiled` and `OpenVino` stay importable here.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402
from benchmarks.ab_harness import OpenVino, profiled  # noqa: E402,F401


def main(argv: list[str] | None = None) -> int:
    return ab.main(argv, description=__doc__.splitlines()[0], models=["minilm"])


if __name__ == "__main__":
    raise SystemExit(main())
