"""A/B of MobileNetV2 with its inverted-residual blocks on the native kernel (mbv14) against
the oneDNN route, in one process, alternating blocks (the order reversed every round):

    old: PGX_CPU_NATIVE_MBCONV=0    new: the default (the measured rule)   [all: every block]

    python benchmarks/mbv14_ab.py --threads 2 --batch 1 --rounds 10 --runs 20 [--new-first]
        [--all] [--quiet SECONDS] [--json FILE]

`mnv16_ab.py`'s arguments and figures (`benchmarks/ab_harness.py`, the one harness) with these
variants; `--all` adds `all` (`PGX_CPU_NATIVE_MBCONV=all`) as a third.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402

OLD = {"PGX_CPU_NATIVE_MBCONV": "0"}


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=[], rounds=10, runs=20, warmup=3, settle=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--all", action="store_true", help="also PGX_CPU_NATIVE_MBCONV=all")
    args = p.parse_args(argv)
    more = [ab.Variant("all", {"PGX_CPU_NATIVE_MBCONV": "all"}, args.bf16)] if args.all else []
    models = args.models or [f"mobilenetv2:{args.batch}"]
    return ab.run_args(args, old=OLD, models=models, more=more)


if __name__ == "__main__":
    raise SystemExit(main())
