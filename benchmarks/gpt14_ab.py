"""A/B in one process: GPT-2 with causal key-block skipping in the native attention kernel (B)
against the full kernel reading the causal mask (A, `PGX_CPU_NATIVE_ATTENTION_CAUSAL=0`).

    PYTHONPATH=. python benchmarks/gpt14_ab.py --threads 2 --batches 1 8 --rounds 12
    PYTHONPATH=. python benchmarks/gpt14_ab.py --threads 1 --batches 1 --rounds 8 --bf16

Per batch: GPT-2 (the built-in one, s128, attention_mask all ones) compiled twice, float32 (or
bf16 with `--bf16`: `quantize_bf16`'s default policy), A with the switch off and B with it on
(the switch is read when a block is lowered). A wrapper of `benchmarks/ab_harness.py` (the one
harness): runs alternate A B in even rounds, B A in odd ones, after two warm-up runs each;
printed: the median run (thread CPU time at one thread, wall at more), B/A, the median of the
rounds' B - A, the A vs B output difference (0 expected: the kernel's weights of masked keys
are exactly 0 either way), each one's relative RMS error against ONNX Runtime float32
(`--no-ort`: skipped), and the load before and after.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402
from pygraphx.targets.torch_lowering import native_attention  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=[], threads=2, rounds=12, warmup=2)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    args = p.parse_args(argv)
    env = native_attention.CAUSAL_ENV
    if not (args.variant or args.old is not None or args.new is not None):
        args.variant = [f"A:{env}=0", f"B:{env}=1"]
    return ab.run_args(args, models=args.models or [f"gpt2:{b}" for b in args.batches])


if __name__ == "__main__":
    raise SystemExit(main())
