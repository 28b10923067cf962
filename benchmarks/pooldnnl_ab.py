"""A/B of the pooling steps on oneDNN (`onednn_pool.py`) against torch's kernels, in runs of a
whole CNN, in one process.

    python benchmarks/pooldnnl_ab.py --model mobilenetv2 --threads 1 --batch 1 --rounds 8
    python benchmarks/pooldnnl_ab.py --model yolov8_style --threads 2 --rounds 4
    python benchmarks/pooldnnl_ab.py --model resnet50 --batch 8 --bf16 --n 3

Two programs of the same model, compiled with `PGX_CPU_POOL=torch` (A) and `onednn` (B), the
order of the compiles alternating with `--torch-first`; in alternating rounds, each program's
steps timed over `--n` runs by `profile.time_steps` with the thread CPU clock (the steps run
in the middle of real runs: the caches as a run leaves them), and a block of the same number
of plain runs timed with the process CPU clock (worker threads included). Per program the
medians over rounds of: the pooling steps' thread CPU per run (each and in all), the step
after each pooling (a cost moved there would show), every step's sum, and the process CPU of
a run. Outputs are checked against ONNX Runtime's. `PGX_CPU_LOAD_ADAPT=0` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("PGX_CPU_LOAD_ADAPT", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
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


def compiled(data: bytes, threads: int, kernel: str, bf16: bool) -> object:
    """The model compiled for the cpu target with `PGX_CPU_POOL=kernel` (`bf16`: after
    `quantize_bf16`'s default conversion)."""
    from pygraphx.targets.cpu.target import CpuTarget

    os.environ["PGX_CPU_POOL"] = kernel
    prog = pygraphx.parse_onnx_buffer(data)
    if bf16:
        pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(threads=threads))
    return prog


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--n", type=int, default=20, help="runs per program per round")
    p.add_argument("--torch-first", action="store_true", help="compile the torch program first")
    p.add_argument("--bf16", action="store_true", help="quantize_bf16 both programs")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import onnxruntime as ort

    data, feeds = load(args.model, args.batch)
    order = ["torch", "onednn"] if args.torch_first else ["onednn", "torch"]
    progs = {k: compiled(data, args.threads, k, args.bf16) for k in order}
    want = ort.InferenceSession(data).run(None, feeds)[0]
    for k, prog in progs.items():
        got = np.asarray(prog.run(feeds)[0])
        print(f"{k}: max|diff| vs ORT {float(np.abs(got - want).max()):.3g}")
    for k, prog in progs.items():
        print(f"{k}: pooling steps and the step after each: {around_pools(prog)}")
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in order}
    for r in range(args.rounds):
        for k in order if r % 2 == 0 else order[::-1]:
            rows[k].append(measure(progs[k], feeds, args.n))
        print(f"round {r}: " + "  ".join(
            f"{k} pool {rows[k][-1]['pool']:.1f} after {rows[k][-1]['after']:.1f} steps "
            f"{rows[k][-1]['steps']:.0f} process {rows[k][-1]['process']:.0f}" for k in order
        ))  # fmt: skip
    med = {k: {c: statistics.median(r[c] for r in rows[k]) for c in rows[k][0]} for k in order}
    kind = "bf16" if args.bf16 else "float32"
    print(f"{args.model} {kind} threads {args.threads} batch {args.batch} n {args.n} "
          f"load {os.getloadavg()} (us per run, medians over {args.rounds} rounds)")  # fmt: skip
    for k in order:
        print(f"median {k}: " + "  ".join(f"{c} {v:.1f}" for c, v in med[k].items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "median": med,
                                               "load": os.getloadavg()}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
