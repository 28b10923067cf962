"""A/B of whole models for helper tfov17 (transformer encoders against OpenVINO float32), one
process: `old` (the float32 attention block's output a new tensor each run,
`PGX_CPU_ATTENTION_SLOT=0`, and the erf-GELU pass in two forms, `PGX_CPU_GELU_ERF_MIDDLE=0`),
`slot` (the block writes its arena slot; GELU as old) and `new` (both: GELU's middle form
too); `benchmarks/gemm15_ab.py`'s harness (each variant compiled with its variables set; runs
alternate one per variant, the order reversed every round: both orders; median wall ms at 2+
threads, thread CPU ms at 1 thread; rel. RMS error against ONNX Runtime float32;
`--wait-quiet S`, `--steps`, `--openvino` as there).

    PYTHONPATH=. python benchmarks/tfov17_ab.py --threads 1 --rounds 12 \
        --models minilm vit_b16 bert_base:1 gpt2:1
    PYTHONPATH=. python benchmarks/tfov17_ab.py --threads 2 --rounds 12 --wait-quiet 60 \
        --models minilm vit_b16 bert_base:1 gpt2:1

`--variant` may be given to replace the default three.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchmarks.gemm15_ab as base  # noqa: E402

DEFAULT = ["--variant", "old:PGX_CPU_ATTENTION_SLOT=0,PGX_CPU_GELU_ERF_MIDDLE=0",
           "--variant", "slot:PGX_CPU_GELU_ERF_MIDDLE=0", "--variant", "new:"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--variant" not in argv:
        argv += DEFAULT
    return base.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
