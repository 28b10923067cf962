"""A/B of a change on whole models in one process (`benchmarks/ab_harness.py` on the command line).

    PYTHONPATH=. python benchmarks/ab.py --old PGX_CPU_GELU_ERF_NATIVE=0 --new \
        --models minilm bert_base:1 --threads 1 --rounds 10 [--steps] [--json FILE]
    PYTHONPATH=. python benchmarks/ab.py --variant a:PGX_CPU_GEMM=mkl --variant b: \
        --models gpt2:1 --threads 2 --rounds 20 --wait-quiet 120 [--bf16] [--openvino]

`--old` / `--new` (`K=V ...`, or `@module.NAME=literal`) are the settings of the variants
`old` and `new`, in force only while each compiles; every option is described in
`ab_harness.py` (`--help` lists them).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ab_harness import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(description=__doc__.splitlines()[0]))
