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
(MiniLM: the zoo's sentences), batch `--batch`. A wrapper of `benchmarks/ab_harness.py` (the
one harness: its table, each variant's error against ONNX Runtime float32 beside it).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402
from benchmarks.acc16_roles import bf16_program  # noqa: E402
from benchmarks.bf16acc14_precisions import load  # noqa: E402


def variant(keep: str) -> ab.Variant:
    def build(case: ab.Case, threads: int):
        import onnx

        model = onnx.load_from_string(case.data)
        return bf16_program(model, threads, None if keep == "none" else keep)[0]

    return ab.Variant(keep, bf16=True, build=build, label=f"bf16_program keep={keep}")


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=["minilm"], threads=1, rounds=10, runs=5,
                  warmup=3, env_options=False)  # fmt: skip
    p.add_argument("--variants", nargs="+", default=["nocenter", "none"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--cpu", action="store_true", help="process CPU time, not wall")
    args = p.parse_args(argv)
    if args.clock == "auto":
        args.clock = "process" if args.cpu else "wall"
    cases = []
    for name in args.models:
        model, inputs = load(name, args.batch)
        cases.append(ab.Case(f"{name} b{args.batch}", model.SerializeToString(), inputs(0)))
    variants = [variant(k) for k in args.variants]
    return ab.run(cases, variants, ab.configs_of(args), args.json, {"argv": sys.argv[1:]})


if __name__ == "__main__":
    raise SystemExit(main())
