"""The cpu target on a busy machine: its runs with and without the load rule of
`pygraphx/targets/cpu/scheduling.py`, against ONNX Runtime, in one process.

    python benchmarks/cpu_busy_ab.py bert_base --batch 1 --threads 2 --repeat 8

Each pygraphx variant compiles its own program with `threads=N` (the run scope of a program
keeps its load check for `scheduling.LOAD_CHECK_S`: a program shared by "on" and "off" would
carry one's thread count into the other's runs); a wrapper of `benchmarks/ab_harness.py` (the
one harness) whose variants set the switch when they run (and put it back after), not when
they compile: the runs
alternate (ORT with `intra_op_num_threads=N`, pygraphx with `PGX_CPU_LOAD_ADAPT` on, pygraphx
with it off; the order reversed every round), so load from elsewhere hits all three alike.
Prints the load average, and per engine the median and best block (wall at 2+ threads, thread
CPU at 1), the process CPU time per run, and the median's ratio to ORT's (ORT runs first). On an
idle machine "on" and "off" compute the same. `--bf16`: both pygraphx programs
`quantize_bf16`'d (ORT stays float32).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401  (before torch: pygraphx sets OpenMP's spin count)
from benchmarks import ab_harness as ab  # noqa: E402
from pygraphx.targets.cpu.scheduling import LOAD_ADAPT_ENV  # noqa: E402


class Engine:
    """A program of its own run with the load rule `adapt`, or ORT's session."""

    def __init__(self, case: ab.Case, threads: int, adapt: str | None, bf16: bool = False) -> None:
        self.adapt = adapt
        if adapt is None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            self.session = ort.InferenceSession(case.data, options,
                                                providers=["CPUExecutionProvider"])  # fmt: skip
            return
        self.prog = ab.compile_variant(case, threads, ab.Variant("pgx", bf16=bf16))

    def run(self, feeds: dict) -> list:
        if self.adapt is None:
            return self.session.run(None, feeds)
        before = os.environ.get(LOAD_ADAPT_ENV)
        os.environ[LOAD_ADAPT_ENV] = self.adapt
        try:
            return self.prog.run(dict(feeds))
        finally:
            if before is None:
                del os.environ[LOAD_ADAPT_ENV]
            else:
                os.environ[LOAD_ADAPT_ENV] = before


def variants(bf16: bool = False) -> list[ab.Variant]:
    """ORT, then pygraphx with the load rule on and off (each its own program)."""
    kind = " bf16" if bf16 else ""
    return [
        ab.Variant("ort", build=lambda c, t: Engine(c, t, None), label="ONNX Runtime"),
        ab.Variant("adapt on", bf16=bf16, build=lambda c, t: Engine(c, t, "1", bf16),
                   label=f"{LOAD_ADAPT_ENV}=1{kind}"),  # fmt: skip
        ab.Variant("adapt off", bf16=bf16, build=lambda c, t: Engine(c, t, "0", bf16),
                   label=f"{LOAD_ADAPT_ENV}=0{kind}"),  # fmt: skip
    ]


VARIANTS = variants()


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=[], threads=2, rounds=8, env_options=False)
    p.add_argument("model", choices=["resnet50", "mobilenetv2", "bert_base", "gpt2"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeat", dest="rounds", type=int, default=8, help="rounds")
    args = p.parse_args(argv)
    models = args.models or [f"{args.model}:{args.batch}"]
    # the bf16 variants say so themselves (their tolerance); ORT keeps the float32 one
    cfgs = [dataclasses.replace(c, bf16=False) for c in ab.configs_of(args)]
    return ab.run(models, variants(args.bf16), cfgs, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
