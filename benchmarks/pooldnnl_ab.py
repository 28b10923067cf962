"""A/B of the pooling steps on oneDNN (`onednn_pool.py`) against torch's kernels, in runs of a
whole CNN, in one process.

    python benchmarks/pooldnnl_ab.py --model mobilenetv2 --threads 1 --batch 1 --rounds 8
    python benchmarks/pooldnnl_ab.py --model yolov8_style --threads 2 --rounds 4
    python benchmarks/pooldnnl_ab.py --model resnet50 --batch 8 --bf16 --n 3

Two programs of the same model, compiled with `PGX_CPU_POOL=onednn` and `torch` (`torch` first
in the first round with `--torch-first`; the ratios are to `onednn` either way). A wrapper of
`benchmarks/ab_harness.py` (the one harness): blocks of `--n` plain runs alternate (both orders;
thread CPU at 1 thread, wall at 2, process CPU beside it), outputs checked against ONNX
Runtime's. Kept here, after that: in alternating rounds, each program's steps timed over `--n`
runs by `profile.time_steps` with the thread CPU clock (the steps run in the middle of real
runs: the caches as a run leaves them), and a block of the same number of plain runs timed with
the process CPU clock (worker threads included). Per program the medians over rounds of: the
pooling steps' thread CPU per run (each and in all), the step after each pooling (a cost moved
there would show), every step's sum, and the process CPU of a run. `PGX_CPU_LOAD_ADAPT=0` is
set.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("PGX_CPU_LOAD_ADAPT", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401  (before torch: it sets OpenMP's spin count)
from benchmarks import ab_harness as ab  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.cpu.profile import time_steps  # noqa: E402


def load(name: str, batch: int) -> tuple[bytes, dict[str, np.ndarray]]:
    """The model's ONNX bytes and inputs: a built-in (any batch) or a zoo model (batch 1)."""
    if name in ("mobilenetv2", "resnet50"):
        model = get_model(name, batch=batch)
        return model.SerializeToString(), model_inputs(name, model)
    from benchmarks.zoo import zoo_model

    if batch != 1:
        raise SystemExit(f"{name}: batch 1 only (the zoo's export)")
    path, feeds = zoo_model(name, "full")
    return Path(path).read_bytes(), feeds


NAMED = {k: ab.Variant(k, {"PGX_CPU_POOL": k}) for k in ("onednn", "torch")}


def measure(prog: object, feeds: dict, n: int) -> dict[str, float]:
    """Microseconds per run: pooling steps (each `pool<k>`, and `pool`), the steps after
    them (`after`), all steps (`steps`, thread CPU), and the process CPU of a run (`process`)."""
    steps = time_steps(prog._executable, feeds, n, time.thread_time)
    row: dict[str, float] = {"pool": 0.0, "after": 0.0}
    k = 0
    for i, s in enumerate(steps):
        if any(ins.op.name == "pooling" for ins in s.instructions):
            row[f"pool{k}"] = s.seconds * 1e6
            row["pool"] += s.seconds * 1e6
            row["after"] += steps[i + 1].seconds * 1e6 if i + 1 < len(steps) else 0.0
            k += 1
    row["steps"] = sum(s.seconds for s in steps) * 1e6
    start = time.process_time()
    for _ in range(n):
        prog.run(feeds)
    row["process"] = (time.process_time() - start) / n * 1e6
    return row


def around_pools(prog: object) -> list[str]:
    """'pooling -> <the ops of the next step>' for each pooling step of `prog`."""
    steps = prog._executable.lowered.steps
    names = [[ins.op.name for ins in s.instructions] for s in steps]
    return [
        f"{'+'.join(n)} -> {'+'.join(names[i + 1]) if i + 1 < len(names) else '-'}"
        for i, n in enumerate(names)
        if "pooling" in n
    ]


def pool_steps(progs: dict, case: ab.Case, cfg: ab.Config, out) -> dict:
    """The pooling steps' table: `cfg.rounds` rounds of `measure` (n = `cfg.runs`),
    alternating, medians over rounds (us a run)."""
    for k, prog in progs.items():
        print(f"  {k}: pooling steps and the step after each: {around_pools(prog)}", file=out)
    names = list(progs)
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in names}
    for r in range(cfg.rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            rows[k].append(measure(progs[k], case.feeds, cfg.runs))
    med = {k: {c: statistics.median(r[c] for r in rows[k]) for c in rows[k][0]} for k in names}
    print(f"  pooling steps, us a run (thread CPU; process: the plain runs' process CPU), medians "
          f"over {cfg.rounds} rounds of {cfg.runs} runs:", file=out)  # fmt: skip
    for k in names:
        print(f"  median {k}: " + "  ".join(f"{c} {v:.1f}" for c, v in med[k].items()), file=out)
    return {"median": med, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=[], threads=1, rounds=8, runs=20, warmup=1,
                  named=NAMED, default_names=["onednn", "torch"])  # fmt: skip
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--n", dest="runs", type=int, default=20, help="runs per program per round")
    p.add_argument("--torch-first", action="store_true", help="the torch program first (run order)")
    args = p.parse_args(argv)
    args.new_first = args.torch_first  # the run order only: the ratios stay to `onednn`
    data, feeds = load(args.model, args.batch)
    case = ab.Case(f"{args.model} b{args.batch}", data, feeds)
    variants = ab.variants_of(args, named=NAMED)
    return ab.run([case], variants, ab.configs_of(args), args.json, extra=pool_steps)


if __name__ == "__main__":
    raise SystemExit(main())
