"""A/B of whole models under environment-variable variants, one process (helper gpt17).

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/gpt17_ab.py --threads 1 --rounds 10 \
        --models gpt2:1 bert_base:1 --variant old: --variant new:PGX_...=1 --steps
    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/gpt17_ab.py --threads 2 --rounds 30 \
        --models gpt2:1 --variant old: --variant new:PGX_...=1 --wait-quiet 120

A thin wrapper of `benchmarks/ab_harness.py` (the one harness; tidyfix17 folded this script's
figures into it): `--spread` always on, so besides each variant's median block (one run a
block: thread CPU ms at 1 thread, wall at more; rel. RMS error against ONNX Runtime float32)
it prints what a loaded 2-core machine needs: the fastest run (`best`), the 25th percentile,
the median of the per-round ratios (a round's runs are adjacent in time: they share the
machine's state), and with `--steps` each kind's sum of per-step fastest times beside the
medians. `--variant` is required (one is enough with `--openvino`: OpenVINO, bf16 with
`--bf16`, as one more variant). `--wait-quiet S`: before each model, wait up to S seconds for
/proc/stat busy < 15 % over 2 s. Every other option of the harness works too (`--help`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.split("\n")[0], models=["gpt2:1"], threads=2, rounds=20, runs=1,
                  warmup=1)  # fmt: skip
    p.set_defaults(spread=True)
    args = p.parse_args(argv)
    if not args.variant:
        p.error("--variant NAME:K=V,... is required (as often as wanted)")
    return ab.run_args(args)


if __name__ == "__main__":
    raise SystemExit(main())
