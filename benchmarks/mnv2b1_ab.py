"""A/B of cpu programs compiled under different settings, in one process, alternating blocks.

    python benchmarks/mnv2b1_ab.py --threads 2 --rounds 20 \\
        --variant before:PGX_CPU_GEMM=addmm --variant after:

A wrapper of `benchmarks/ab_harness.py` (the one harness; its docstring says what it prints) on
`--model` (default mobilenetv2) at `--batch`: each `--variant NAME:VAR=VALUE,...` compiles the
model with those environment variables set (only while it compiles); `@module.NAME=value` sets
an attribute of `pygraphx.targets.torch_lowering.<module>` (`@cpu.module.NAME`:
`pygraphx.targets.cpu.<module>`) instead (a Python literal, e.g.
`before:@onednn_conv.LEAN_CLOSURE=False`); the programs run in alternating blocks (the order
reversed every round), each block `--runs` runs after 2 untimed ones. `--bf16`: every variant
`quantize_bf16`'d first. Printed per program: the median block (wall at 2+ threads, thread CPU
at 1) and the process CPU time a run, the output's difference from ONNX Runtime's. Kept here:
`--steps` also times `--runs` runs a round step by step and prints each variant's summed steps
(median run) and the sum of each step's minimum over all runs (which a loaded machine inflates
least) with the last two steps' minima. `compiled`, `step_walls`, `ort_output`,
`parse_variant` stay importable here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402


def compiled(model: object, threads: int, env: dict[str, str], bf16: bool = False) -> object:
    """`model` compiled for the cpu target with `env` set while it compiles (`@module.NAME`
    keys: module attributes); `bf16`: `quantize_bf16` (its default policy) first."""
    case = ab.Case("", model.SerializeToString(), {})
    return ab.compile_variant(case, threads, ab.Variant("", env, bf16))


def step_walls(prog: object, feeds: dict, runs: int) -> np.ndarray:
    """Each step's wall seconds in each of `runs` runs, (runs, steps)."""
    from pygraphx.targets.cpu.profile import time_steps

    return np.array(
        [[s.seconds for s in time_steps(prog._executable, feeds, 1)] for _ in range(runs)]
    )


def ort_output(model: object, feeds: dict, threads: int) -> np.ndarray:
    return ab.ort_outputs(ab.Case("", model.SerializeToString(), feeds), threads)[0]


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    v = ab.parse_variant(text)
    return v.name, v.env


def step_minima(progs: dict, case: ab.Case, cfg: ab.Config, out) -> dict:
    """`--steps`: each variant's steps timed over `cfg.runs` runs a round, alternating."""
    names = [n for n in progs if n != "OV"]
    sums: dict[str, list[float]] = {n: [] for n in names}
    mins: dict[str, np.ndarray] = {}
    for r in range(cfg.rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            walls = step_walls(progs[n], case.feeds, cfg.runs)
            sums[n].append(float(np.median(walls.sum(axis=1))) * 1e3)
            low = walls.min(axis=0)
            mins[n] = np.minimum(mins[n], low) if n in mins else low
    res = {n: {"steps_ms": round(float(np.median(sums[n])), 3),
               "sum_step_min_ms": round(float(mins[n].sum()) * 1e3, 3),
               "last_steps_min_us": [round(float(t) * 1e6, 1) for t in mins[n][-2:]]}
           for n in names}  # fmt: skip
    for n, v in res.items():
        print(f"  {n:10s} steps {v}", file=out)
    return res


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=[], rounds=10, runs=20, settle=2, warmup=1)
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--batch", type=int, default=1)
    args = p.parse_args(argv)
    steps, args.steps = args.steps, False  # this script's own step figures, not the kinds
    models = args.models or [f"{args.model}:{args.batch}"]
    return ab.run_args(args, models=models, extra=step_minima if steps else None)


if __name__ == "__main__":
    raise SystemExit(main())
