"""A/B of bf16 MobileNetV2 with its inverted-residual blocks on the native bf16 kernel (new:
`PGX_CPU_NATIVE_MBCONV_BF16=1`, `kernels/mbconv_bf16.c`) and on the oneDNN route (old:
`PGX_CPU_NATIVE_MBCONV_BF16=0`), in one process, alternating blocks (helper bfmb16, issue 10):
`mnv16_ab.py` (over `benchmarks/ab_harness.py`) with `--bf16` and those `--old` / `--new` by
default; its other arguments as there:

    python benchmarks/bfmb16_ab.py --threads 2 --batch 1 --rounds 10 --runs 20 [--new-first]
        [--quiet SECONDS] [--json FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.mnv16_ab import main as ab_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--new" not in args and "--variant" not in args:
        args += ["--new", "PGX_CPU_NATIVE_MBCONV_BF16=1"]
    if "--bf16" not in args:
        args.append("--bf16")
    return ab_main(args, old={"PGX_CPU_NATIVE_MBCONV_BF16": "0"}, doc=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
