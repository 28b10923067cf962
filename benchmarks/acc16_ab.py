"""Latency A/B of bf16 program variants in one process (helper acc16, issue 10).

    python benchmarks/acc16_ab.py --models minilm bert_base --variants nocenter none \
        --threads 1 --cpu --rounds 10 --repeat 5
        # process CPU ms a run (1 thread) or wall ms (`--threads 2`, no `--cpu`), blocks of
        # `--repeat` runs alternating between the variants, the order reversed every round;
        # median of each variant's blocks and its best block, each against the first variant

Variants are `acc16_roles.bf16_program`'s `keep` names: `none` (`quantize_bf16` as it is),
`nocenter` (`PGX_BF16_CENTER_LAST_OUT=0`: the program before acc16), `center`, `lastout`
(`attn_out@-1`), or roles kept float32 joined by `+`
(`qk+scale+pv`: the attention in float32). Inputs: seed 0 of `bf16acc14_precisions.load`
(MiniLM: the zoo's sentences), batch `--batch`.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.acc16_roles import bf16_program  # noqa: E402
from benchmarks.bf16acc14_precisions import load  # noqa: E402


def _block(fn, repeat: int, cpu: bool) -> float:
    clock = time.process_time if cpu else time.perf_counter
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return (statistics.mean(times) if cpu else statistics.median(times)) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["minilm"])
    parser.add_argument("--variants", nargs="+", default=["nocenter", "none"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="process CPU time, not wall")
    args = parser.parse_args(argv)
    for name in args.models:
        model, inputs = load(name, args.batch)
        feeds = inputs(0)
        engines = {}
        for v in args.variants:
            prog, _ = bf16_program(model, args.threads, None if v == "none" else v)
            engines[v] = lambda p=prog: p.run(feeds)
        for fn in engines.values():
            for _ in range(args.warmup):
                fn()
        blocks = collections.defaultdict(list)
        for r in range(args.rounds):
            order = list(engines) if r % 2 == 0 else list(reversed(engines))
            for key in order:
                blocks[key].append(_block(engines[key], args.repeat, args.cpu))
        with open("/proc/loadavg") as f:
            load_now = f.read().split()[0]
        first = statistics.median(blocks[args.variants[0]])
        figures = ", ".join(
            f"{k} {statistics.median(v):.2f} (best {min(v):.2f}, "
            f"x{statistics.median(v) / first:.3f})"
            for k, v in blocks.items()
        )
        clock = "process CPU" if args.cpu else "wall"
        print(f"{name} b{args.batch} t{args.threads} {clock} ms, median of {args.rounds} blocks "
              f"(best block, against {args.variants[0]}): {figures}; loadavg at the end {load_now}",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
