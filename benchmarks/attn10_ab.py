"""A/B in one process: this tree's layer-norm steps against their earlier calls.

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/attn10_ab.py --model bert_base \
        --threads 1 --rounds 20

A is compiled with the call the layer-norm steps made before (`F.layer_norm`, its Python
wrapper, where B calls `torch.layer_norm`); B as the tree compiles it. A wrapper of
`benchmarks/ab_harness.py` (the one harness) with `--steps` always on and the steps grouped by
transformer block (`cpu_transformer_blocks.pgx_block`): the two programs run in turn (A B, then
B A), plain runs and then runs with each step timed (thread CPU time at one thread, wall
otherwise). Printed: the median run, per block the median over rounds of each program's sum,
and the difference between the programs' outputs and from ONNX Runtime's. `compile_a`,
`compile_b`, `timed_run`, `model_and_feeds` stay importable here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: its tree wins

import cpu_transformer_blocks as ctb  # noqa: E402

import pygraphx  # noqa: E402
from benchmarks import ab_harness as ab  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402


def compile_a(data: bytes, threads: int) -> Any:
    """The program with the earlier calls (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    real_norm = torch.layer_norm
    torch.layer_norm = F.layer_norm  # bound by the lowering; F calls the real one at run time
    try:
        return compile_b(data, threads)
    finally:
        torch.layer_norm = real_norm


def compile_b(data: bytes, threads: int) -> Any:
    prog = pygraphx.parse_onnx_buffer(data)
    prog.compile(CpuTarget(threads=threads))
    return prog


def timed_run(prog: Any, feeds: dict, clock: Callable[[], int]) -> tuple[np.ndarray, float, list]:
    """One run with each step timed: (step times, the run's time, the outputs)."""
    exe = prog._executable
    times = np.zeros(len(exe.executor.steps))
    start = clock()
    exe.executor.bind(feeds)
    with exe.scope():
        for i, fn in enumerate(exe.executor.steps):
            t0 = clock()
            fn()
            times[i] = clock() - t0
    outs = [np.array(o, copy=True) for o in exe.executor.collect()]
    return times, clock() - start, outs


def model_and_feeds(name: str, threads: int, batch: int = 1) -> tuple[bytes, dict]:
    """A built-in model's bytes and inputs, torch set to `threads`."""
    import torch

    torch.set_num_threads(threads)
    model = get_model(name, batch=batch)
    return model.SerializeToString(), model_inputs(name, model)


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=[], threads=1, rounds=20, warmup=2,
                  env_options=False)  # fmt: skip
    p.add_argument("--model", default="bert_base", choices=["bert_base", "gpt2"])
    args = p.parse_args(argv)
    variants = [ab.Variant("A", build=lambda c, t: compile_a(c.data, t), label="F.layer_norm"),
                ab.Variant("B", build=lambda c, t: compile_b(c.data, t), label="this tree")]
    cfgs = [replace(c, steps=True, kind_of=ctb.pgx_block) for c in ab.configs_of(args)]
    return ab.run(args.models or [f"{args.model}:1"], variants, cfgs, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
