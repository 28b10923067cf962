"""A run's work outside its steps, before (main's code paths, restated here) and after
(this tree's), each with the caches flushed first as a network's steps leave them: one
process, alternating, median us per phase.

    python benchmarks/chain11_cold_phases.py --model mobilenetv2 --reps 300

Phases: bind (one float32 input), load check (`PGX_CPU_LOAD_ADAPT` and the load average),
the budget's acquire, inference mode on, inference mode off, the budget's release, collect
(one fresh output). "before": `dtypes.env_value`, `threads.load_threads` every run, the
base revision's `ThreadBudget` (`Condition` entered, `notify_all`), `torch.inference_mode`,
`to_numpy` through `take`; "after": what `CpuExecutable` and `RunScope` do now. The flush
writes `--flush-mb` MiB.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pygraphx  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402

PHASES = ["bind", "load_check", "acquire", "mode_on", "mode_off", "release", "collect"]


def base_threads(rev: str) -> ModuleType:
    """`pygraphx/targets/cpu/threads.py` as it is at revision `rev`, as module `base_threads`
    (registered: its dataclasses look their module up)."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:pygraphx/targets/cpu/threads.py"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    module = ModuleType("base_threads")
    sys.modules["base_threads"] = module
    exec(compile(source, f"{rev}:threads.py", "exec"), module.__dict__)  # noqa: S102
    return module


def old_paths(exe: object, base: str) -> dict:
    """main's bind, load check, budget, inference mode and collect for `exe` (the budget:
    `ThreadBudget` of `threads.py` at revision `base`)."""
    import torch

    from pygraphx.targets.cpu.threads import load_threads
    from pygraphx.targets.torch_lowering.dtypes import env_value, to_numpy

    ctx = exe.lowered.ctx
    env, params, outputs, fresh = ctx.env, list(exe.lowered.params), exe.lowered.outputs, ctx.fresh

    def bind(values: dict) -> None:
        for name, idx in params:
            env[idx] = env_value(values[name])

    def take(idx: int) -> np.ndarray:
        t = env[idx]
        if isinstance(t, np.ndarray):
            return t.copy()
        if idx in fresh and t.is_contiguous():
            return to_numpy(t)
        return to_numpy(t.clone(memory_format=torch.contiguous_format))

    def collect() -> list:
        return [take(i) for i in outputs]

    scope = exe.scope
    mode = torch.inference_mode()
    return {
        "bind": bind,
        "load": lambda: load_threads(scope.n, cpus=scope._cpus, usable=scope._usable),
        "budget": base_threads(base).ThreadBudget(64),
        "mode": lambda: mode,
        "collect": collect,
    }


def new_paths(exe: object) -> dict:
    """This tree's: the executable's own bind and collect, the scope's load check and guard."""
    from pygraphx.targets.cpu.threads import ThreadBudget

    scope = exe.scope
    return {
        "bind": exe.executor.bind,
        "load": scope._load_threads,
        "budget": ThreadBudget(64),
        "mode": lambda: scope._inference(True),
        "collect": exe.executor.collect,
    }


def phased(paths: dict, feeds: dict, flush: np.ndarray) -> list[int]:
    """The phases once, cold: the caches flushed first; ns each."""
    flush += 1.0  # (every line of the buffer written: the caches hold it, not the run's)
    ns = time.perf_counter_ns
    t = [ns()]
    paths["bind"](feeds)
    t.append(ns())
    paths["load"]()
    t.append(ns())
    budget = paths["budget"]
    budget.acquire(2)
    t.append(ns())
    mode = paths["mode"]()
    mode.__enter__()
    t.append(ns())
    mode.__exit__(None, None, None)
    t.append(ns())
    budget.release()
    t.append(ns())
    paths["collect"]()
    t.append(ns())
    return [b - a for a, b in zip(t, t[1:], strict=False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenetv2")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--flush-mb", type=int, default=48)
    ap.add_argument("--base", default="main", help="revision of the budget's before")
    args = ap.parse_args()
    model = get_model(args.model, batch=1)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs(args.model, model).items()}
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu", threads=2))
    prog.run(feeds)
    exe = prog._executable
    variants = {"before": old_paths(exe, args.base), "after": new_paths(exe)}
    flush = np.zeros(args.flush_mb << 17)  # float64: 8 bytes each
    rows: dict[str, list[list[int]]] = {k: [] for k in variants}
    for r in range(args.reps):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            rows[name].append(phased(variants[name], feeds, flush))
    print(f"{args.model} b1: median us per phase, cold (flush {args.flush_mb} MiB), "
          f"{args.reps} reps alternating")  # fmt: skip
    for name, got in rows.items():
        med = np.median(np.array(got), axis=0) / 1e3
        cells = " ".join(f"{p} {v:.1f}" for p, v in zip(PHASES, med, strict=True))
        print(f"{name:>7}: total {med.sum():.1f} | {cells}")


if __name__ == "__main__":
    main()
