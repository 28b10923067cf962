"""A/B of MobileNetV2 with mnv16's changes on (new: the default) and off (old: `--old`, by
default `@cpu.scheduling.SKIP_SAME_COUNT=False`, torch's thread count set three times a run),
in one process, alternating blocks (the order reversed every round), with `--bf16` both
variants `quantize_bf16`'d first. Also mnv15's A/B (`--old PGX_CPU_NATIVE_MBHEAD=0`: the
session-15 script `mnv15_ab.py` was this without `--bf16`, and is gone):

    python benchmarks/mnv16_ab.py --threads 2 --batch 1 --rounds 10 --runs 20 [--new-first]
        [--old K=V,K=V] [--new K=V,...] [--bf16] [--quiet SECONDS] [--json FILE]

A wrapper of `benchmarks/ab_harness.py` (the one harness; its docstring says what it prints):
each variant compiled (the settings in force only while it compiles), checked against ONNX
Runtime, warmed (3 runs); with `--quiet S` (= `--wait-quiet S`) the timing waits at most S
seconds for a quiet moment (`/proc/stat` busy < 15 % over 2 s) and says whether the machine was
quiet before and how busy after. Printed per variant: the median block a run (wall at 2+
threads, thread CPU at 1), the best block, the process CPU time. `--new-first` runs the new
variant first in the first round (the ratios stay new / old).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402

OLD = {"@cpu.scheduling.SKIP_SAME_COUNT": "False"}


def main(argv: list[str] | None = None, old: dict | None = None, doc: str = __doc__) -> int:
    p = ab.parser(doc.splitlines()[0], models=[], rounds=10, runs=20, warmup=3, settle=1)
    p.add_argument("--batch", type=int, default=1)
    args = p.parse_args(argv)
    models = args.models or [f"mobilenetv2:{args.batch}"]
    return ab.run_args(args, old=OLD if old is None else old, models=models)


if __name__ == "__main__":
    raise SystemExit(main())
