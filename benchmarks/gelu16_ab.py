"""A/B of whole models, oneDNN's gelu (erf) post-op (old) against the native pass (new), one
process (helper gelu16): a wrapper of `benchmarks/ab_harness.py` (each variant compiled with
its variables set; runs alternate one per variant, the order reversed every round: both orders;
median wall ms at 2+ threads, thread CPU ms at 1 thread; rel. RMS error against ONNX Runtime
float32; `--wait-quiet S`, `--bf16`, `--openvino`, `--steps` as there).

    PYTHONPATH=. python benchmarks/gelu16_ab.py --threads 1 --rounds 10 \
        --models bert_base:1 bert_base:8 vit_b16 minilm

`--variant` (or `--old` / `--new`) replaces the default pair (old:
PGX_CPU_GELU_ERF_NATIVE=0, new).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return ab.main(argv, description=__doc__.splitlines()[0], models=["minilm"],
                   old={"PGX_CPU_GELU_ERF_NATIVE": "0"})  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
