"""A/B of cpu programs compiled under different settings, in one process, alternating blocks.

    python benchmarks/mnv2b1_ab.py --threads 2 --rounds 20 \\
        --variant before:PGX_CPU_GEMM=addmm --variant after:

Each `--variant NAME:VAR=VALUE,...` compiles the model with those environment variables set
(only while it compiles; nothing else differs); `@module.NAME=value` sets an attribute of
`pygraphx.targets.torch_lowering.<module>` (`@cpu.module.NAME`:
`pygraphx.targets.cpu.<module>`) instead (a Python literal, e.g.
`before:@onednn_conv.LEAN_CLOSURE=False`); the programs then run in alternating blocks
(the order reversed every round), each block `--runs` runs. `--bf16`: every variant
`quantize_bf16`'d first. Printed per program: median over the
blocks of the wall time and the process CPU time a run, the median over blocks of the steps'
summed wall (`--steps`: each step's minimum over all runs too, which a loaded machine inflates
least), and the output's largest difference from ONNX Runtime's.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402  (before torch: it sets OpenMP's spin and the allocator)
from pygraphx.models import get_model, model_inputs  # noqa: E402


def compiled(model: object, threads: int, env: dict[str, str], bf16: bool = False) -> object:
    """`model` compiled for the cpu target with `env` set while it compiles (`@module.NAME`
    keys: module attributes); `bf16`: `quantize_bf16` (its default policy) first."""
    import importlib
    from contextlib import ExitStack
    from unittest import mock

    from pygraphx.targets.cpu.target import CpuTarget

    with ExitStack() as stack:
        for key, value in env.items():
            if key.startswith("@"):
                module_name, _, name = key[1:].rpartition(".")
                package = "cpu" if module_name.startswith("cpu.") else "torch_lowering"
                module_name = module_name.removeprefix("cpu.")
                module = importlib.import_module(f"pygraphx.targets.{package}.{module_name}")
                stack.enter_context(mock.patch.object(module, name, ast.literal_eval(value)))
            else:
                stack.enter_context(mock.patch.dict(os.environ, {key: value}))
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        if bf16:
            pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=threads))
    return prog


def step_walls(prog: object, feeds: dict, runs: int) -> np.ndarray:
    """Each step's wall seconds in each of `runs` runs, (runs, steps)."""
    from pygraphx.targets.cpu.profile import time_steps

    return np.array(
        [[s.seconds for s in time_steps(prog._executable, feeds, 1)] for _ in range(runs)]
    )


def ort_output(model: object, feeds: dict, threads: int) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, settings = text.partition(":")
    env = dict(item.split("=", 1) for item in settings.split(",") if item)
    return name, env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--runs", type=int, default=20, help="runs per block")
    p.add_argument("--variant", action="append", required=True, help="NAME:VAR=VALUE,...")
    p.add_argument("--steps", action="store_true", help="also per-step minimum walls")
    p.add_argument("--json", default=None)
    p.add_argument("--bf16", action="store_true", help="quantize_bf16 every variant")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = get_model(args.model, batch=args.batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs(args.model, model).items()}
    variants = [parse_variant(v) for v in args.variant]
    progs = {name: compiled(model, args.threads, env, args.bf16) for name, env in variants}
    want = ort_output(model, feeds, args.threads)
    diffs = {n: float(np.abs(np.asarray(pr.run(feeds)[0]) - want).max()) for n, pr in progs.items()}
    outs = [np.asarray(pr.run(feeds)[0]) for pr in progs.values()]
    same = all(np.array_equal(outs[0], o) for o in outs[1:])
    rows = {n: {"wall_ms": [], "cpu_ms": [], "steps_ms": []} for n in progs}
    mins = {n: None for n in progs}
    order = list(progs.items())
    for r in range(args.rounds):
        for name, prog in order if r % 2 == 0 else order[::-1]:
            for _ in range(2):
                prog.run(feeds)
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(args.runs):
                prog.run(feeds)
            rows[name]["cpu_ms"].append((time.process_time() - c0) / args.runs * 1e3)
            rows[name]["wall_ms"].append((time.perf_counter() - w0) / args.runs * 1e3)
            if args.steps:
                walls = step_walls(prog, feeds, args.runs)
                rows[name]["steps_ms"].append(float(np.median(walls.sum(axis=1))) * 1e3)
                low = walls.min(axis=0)
                mins[name] = low if mins[name] is None else np.minimum(mins[name], low)
    print(
        f"{args.model} batch {args.batch} threads {args.threads} rounds {args.rounds} x {args.runs}"
        f"{' bf16' if args.bf16 else ''}; outputs bit-identical across variants: {same}; "
        f"loadavg {Path('/proc/loadavg').read_text().split()[:3]}"
    )
    summary = {}
    for name, cols in rows.items():
        med = {k: round(float(np.median(v)), 3) for k, v in cols.items() if v}
        if mins[name] is not None:
            med["sum_step_min_ms"] = round(float(mins[name].sum()) * 1e3, 3)
            med["last_steps_min_us"] = [round(float(t) * 1e6, 1) for t in mins[name][-2:]]
        med["max_abs_diff_vs_ort"] = diffs[name]
        summary[name] = med
        print(name, med)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "summary": summary, "rows": rows})
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
