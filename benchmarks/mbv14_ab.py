"""A/B of MobileNetV2 with its inverted-residual blocks on the native kernel (mbv14) against
the oneDNN route, in one process, alternating blocks (the order reversed every round):
`benchmarks/mnv2b1_ab.py` with the variants

    old: PGX_CPU_NATIVE_MBCONV=0    new: the default (the measured rule)   [all: every block]

    python benchmarks/mbv14_ab.py --threads 1 --batch 1 --rounds 10 --runs 20 [--new-first]
        [--all] [--steps] [--json FILE]

`--new-first` lists the new variant first (the other order); `--all` adds the variant with
every block on the kernel (`PGX_CPU_NATIVE_MBCONV=all`). Other arguments go to mnv2b1_ab.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mnv2b1_ab import main as ab_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    new_first = "--new-first" in args
    every = "--all" in args
    args = [a for a in args if a not in ("--new-first", "--all")]
    variants = ["old:PGX_CPU_NATIVE_MBCONV=0", "new:"]
    if every:
        variants.append("all:PGX_CPU_NATIVE_MBCONV=all")
    if new_first:
        variants = variants[::-1]
    for v in variants:
        args += ["--variant", v]
    return ab_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
