"""A/B of whole models under environment-variable variants, one process (helper gemm15).

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/gemm15_ab.py --threads 2 --rounds 20 \
        --bf16 --models bert_base:1 --variant old:PGX_CPU_GEMM_RESIDUAL_BF16=0 --variant new: \
        --openvino --wait-quiet 120

`benchmarks/gemm14_ab.py`'s harness (each variant compiled with its variables set; runs
alternating one per variant, the order reversed every round: both orders; median wall ms at
2+ threads, thread CPU ms at 1 thread; rel. RMS error against ONNX Runtime float32; `--steps`,
`--openvino` as there), plus `--wait-quiet S`: before each model, wait up to S seconds for a
quiet moment (/proc/stat busy < 15 % over 2 s) and say whether one came.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchmarks.gemm14_ab as base  # noqa: E402


def busy(seconds: float = 2.0) -> float:
    """The fraction of the machine's CPU time spent busy over `seconds` (/proc/stat)."""

    def sample() -> tuple[int, int]:
        f = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = f[3] + f[4]
        return sum(f), idle

    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(t1 - t0, 1)


def wait_quiet(limit: float) -> str:
    end = time.monotonic() + limit
    while True:
        b = busy()
        if b < 0.15:
            return f"quiet (busy {b:.0%} over 2 s)"
        if time.monotonic() > end:
            return f"NOT quiet (busy {b:.0%} over 2 s after waiting {limit:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    limit = None
    if "--wait-quiet" in argv:
        i = argv.index("--wait-quiet")
        limit = float(argv[i + 1])
        del argv[i : i + 2]
    if limit is None:
        return base.main(argv)
    models = []
    if "--models" in argv:
        i = argv.index("--models")
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        models, argv = argv[i + 1 : j], argv[:i] + argv[j:]
    rc = 0
    for spec in models or ["minilm"]:
        print(f"# {spec}: {wait_quiet(limit)}", flush=True)
        rc |= base.main([*argv, "--models", spec])
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
