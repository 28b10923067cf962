"""A/B of helper bfmnv17's bf16 MobileNetV2 rule, one process (`benchmarks/ab_harness.py`).

    PGX_CPU_LOAD_ADAPT=0 PGX_CPU_STALL_ADAPT=0 PYTHONPATH=. python benchmarks/bfmnv17_ab.py \
        --models mobilenetv2:1 --threads 2 --rounds 20 --runs 20 --wait-quiet 120 [--new-first]

Variants (both `quantize_bf16`'d, `--bf16` is implied): `old`, bfmb16's 2-thread rule (a bf16
block takes the native kernel where it has an expansion and its output map has more than 49
pixels: `native_mbconv.BF16_NO_EXPANSION = False`, `BF16_MIN_PIXELS_THREADS = 49`) and `new`,
every bf16 block on the kernel at 2 threads (`True`, `0`: the first block and the four 7x7
blocks join the block chain). Both are set explicitly, so the A/B means the same whatever the
defaults are. `PGX_CPU_LOAD_ADAPT=0 PGX_CPU_STALL_ADAPT=0` must be in the environment for a
2-thread A/B (mnv17: the stall adaptation lowered both programs to 1 thread). `--openvino`
adds OpenVINO bf16 (its error against ORT float32 for the comparison). Other options:
`ab_harness.py --help`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ab_harness import main  # noqa: E402

OLD = {"@native_mbconv.BF16_NO_EXPANSION": "False", "@native_mbconv.BF16_MIN_PIXELS_THREADS": "49"}
NEW = {"@native_mbconv.BF16_NO_EXPANSION": "True", "@native_mbconv.BF16_MIN_PIXELS_THREADS": "0"}


def note(prog) -> str:
    """The program's steps and how many of them are native block chains."""
    steps = prog._executable.executor.steps
    return f"{len(steps)} steps"


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--bf16" not in argv:
        argv = [*argv, "--bf16"]
    raise SystemExit(main(argv, description=__doc__.splitlines()[0], old=OLD, new=NEW,
                          note=note, models=["mobilenetv2:1"], threads=2, rounds=20, runs=20))
