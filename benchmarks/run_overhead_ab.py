"""Per-run overhead of `Program.run` outside the steps: this tree against a base revision, A/B
in one process on one compiled program.

    python benchmarks/run_overhead_ab.py mobilenetv2 --bf16 --threads 1 --rounds 8 --repeat 60

The base revision's `Program` class (`pygraphx/ir/program.py`) and `from_numpy`
(`torch_lowering/dtypes.py`) are loaded from `git show BASE:...` and swapped in for alternate
blocks of runs (the program object's class is changed; the executable is the same), so load
from other processes hits both alike. Per variant: process CPU ms per run (median of the
blocks), and, measured inside every call, the median "program layer" (`Program.run` less the
executable's run: input check, output aliasing and wrapping) and "executor layer" (the
executable's run less its step loop: binding, the run scope, collecting the outputs).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import pygraphx  # noqa: E402  (before torch: pygraphx sets OpenMP's spin count)
from pygraphx.ir.program import Program  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.torch_lowering import dtypes  # noqa: E402


def base_module(rev: str, path: str, name: str) -> ModuleType:
    """`path` as it is at revision `rev`, imported as module `name`."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True, capture_output=True
    ).stdout
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)  # noqa: S102
    return module


class LayerClock:
    """Times every executable run and its step loop (patched in for the whole A/B)."""

    def __init__(self, prog: Program) -> None:
        self.inner: list[float] = []
        self.steps: list[float] = []
        exe = prog._executable
        run, steps, clock = type(exe).run, exe.executor.steps, time.perf_counter
        inner, loops = self.inner, self.steps

        def timed(self: Any, params: Any, observer: Any = None) -> Any:
            start = clock()
            out = run(self, params, observer)
            inner.append(clock() - start)
            return out

        class Steps:
            def __iter__(self) -> Any:
                start = clock()
                yield from steps
                loops.append(clock() - start)

        type(exe).run = timed
        exe.executor.steps = Steps()

    def clear(self) -> None:
        self.inner.clear()
        self.steps.clear()


def block(prog: Program, feeds: dict, n: int, clock: LayerClock) -> tuple[float, float, float]:
    """n runs: (process CPU ms per run, median program-layer us, median executor-layer us)."""
    for _ in range(3):
        prog.run(feeds)
    clock.clear()
    totals = []
    cpu = time.process_time()
    for _ in range(n):
        start = time.perf_counter()
        prog.run(feeds)
        totals.append(time.perf_counter() - start)
    cpu = 1e3 * (time.process_time() - cpu) / n
    total, inner, steps = map(np.array, (totals, clock.inner, clock.steps))
    return cpu, 1e6 * float(np.median(total - inner)), 1e6 * float(np.median(inner - steps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=["mobilenetv2", "resnet50", "bert_base"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=60)
    ap.add_argument("--base", default="main")
    args = ap.parse_args()
    old_prog = base_module(args.base, "pygraphx/ir/program.py", "base_program")
    old_dt = base_module(args.base, "pygraphx/targets/torch_lowering/dtypes.py", "base_dtypes")
    variants = {
        args.base: (old_prog.Program, old_dt.from_numpy),
        "this tree": (Program, dtypes.from_numpy),
    }
    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    if args.bf16:
        pygraphx.quantize_bf16(prog)
    prog.compile(pygraphx.get_target("cpu", threads=args.threads))
    clock = LayerClock(prog)
    stats: dict[str, list[tuple[float, float, float]]] = {k: [] for k in variants}
    outputs = {}
    for _ in range(args.rounds):
        for name, (cls, from_numpy) in variants.items():
            prog.__class__, dtypes.from_numpy = cls, from_numpy
            stats[name].append(block(prog, feeds, args.repeat, clock))
            outputs[name] = [np.array(o) for o in prog.run(feeds)]
    same = all(np.array_equal(a, b) for a, b in zip(*outputs.values(), strict=True))
    print(f"{args.model} b{args.batch} threads {args.threads}{' bf16' if args.bf16 else ''}; "
          f"outputs equal: {same}")  # fmt: skip
    for name, rows in stats.items():
        cpu, prog_us, exec_us = (np.median([r[k] for r in rows]) for k in range(3))
        blocks = " ".join(f"{r[0]:.2f}" for r in rows)
        print(f"{name:>10}: cpu {cpu:.3f} ms/run (blocks {blocks}); program layer "
              f"{prog_us:.1f} us, executor layer {exec_us:.1f} us")  # fmt: skip


if __name__ == "__main__":
    main()
