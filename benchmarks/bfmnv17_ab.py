"""A/B of helper bfmnv17's bf16 MobileNetV2 rule, one process (`benchmarks/ab_harness.py`).

    PGX_CPU_LOAD_ADAPT=0 PGX_CPU_STALL_ADAPT=0 PYTHONPATH=. python benchmarks/bfmnv17_ab.py \
        --models mobilenetv2:1 --threads 2 --rounds 20 --runs 20 --wait-quiet 120 [--new-first]

Variants (both `quantize_bf16`'d, `--bf16` is implied): `old`, bfmb16's rule (2 threads only;
there a bf16 block takes the native kernel where it has an expansion and its output map has
more than 49 pixels: `native_mbconv.BF16_THREADS = (2,)`, `BF16_NO_EXPANSION = False`,
`BF16_MIN_PIXELS_THREADS = 49`; = `PGX_CPU_NATIVE_MBCONV_BF16_ALL=0`) and `new`, every bf16
block on the kernel at 1 and 2 threads (`(1, 2)`, `True`, `0`: at 2 threads the first block
and the four 7x7 blocks join the block chain). Both are set explicitly, so the A/B means the
same whatever the defaults are. (bfmnv17's 2-thread runs patched only the last two, the same
programs at 2 threads; its 1-thread runs compared `--old` (defaults then: bfmb16's rule) with
`--new PGX_CPU_NATIVE_MBCONV=all`, the same programs as these at 1 thread.) `PGX_CPU_LOAD_ADAPT=0 PGX_CPU_STALL_ADAPT=0` must be in the environment for a
2-thread A/B (mnv17: the stall adaptation lowered both programs to 1 thread). `--openvino`
adds OpenVINO bf16 (its error against ORT float32 for the comparison). Other options:
`ab_harness.py --help`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ab_harness import main  # noqa: E402

OLD = {"@native_mbconv.BF16_THREADS": "(2,)", "@native_mbconv.BF16_NO_EXPANSION": "False",
       "@native_mbconv.BF16_MIN_PIXELS_THREADS": "49"}  # fmt: skip
NEW = {"@native_mbconv.BF16_THREADS": "(1, 2)", "@native_mbconv.BF16_NO_EXPANSION": "True",
       "@native_mbconv.BF16_MIN_PIXELS_THREADS": "0"}  # fmt: skip


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
