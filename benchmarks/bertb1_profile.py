"""pygraphx `cpu` against OpenVINO (float32 and bf16) and ORT, block by block, on 2 threads.

    PYTHONPATH=. python benchmarks/bertb1_profile.py --model bert_base --runs 10
    PYTHONPATH=. python benchmarks/bertb1_profile.py --model gpt2 --bf16 --threads 2

The engines alternate run by run in one process, each run timed by wall clock (median: the
done-when figures are wall times on 2 threads); blocks come from the fast path's per-step wall
time (pygraphx, each step's fastest run), ORT's profiler and OpenVINO's `PERF_COUNT` (each node's
fastest run), scaled to the engine's run (the helpers and block kinds
of `cpu_transformer_blocks.py`). `--nodes` also lists OpenVINO's node kinds (type / kernel) and
our step kinds (their instructions) with their times, to see what each block holds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scratch import scratch_dir  # noqa: E402

import cpu_transformer_blocks as ctb  # noqa: E402
import numpy as np  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402


def ov_block(node_type: str, exec_type: str, output: list[int]) -> str:
    """`cpu_transformer_blocks.ov_block`, with a float32 `Subgraph` of a 4-D result (its fused
    attention at float32) as `attention` too."""
    if node_type == "Subgraph" and len(output) == 4:
        return "attention"
    return ctb.ov_block(node_type, exec_type, output)


def openvino(model: Any, precision: str, threads: int, runs: int, feeds: dict) -> tuple:
    """OpenVINO at `precision` on `threads`: run function, seconds per block, seconds per
    (node type, kernel) (each node's fastest of `runs` profiled runs)."""
    import openvino as ov

    path = Path(scratch_dir()) / "model.onnx"
    path.write_bytes(model.SerializeToString())
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads,
              "NUM_STREAMS": 1}  # fmt: skip
    plain = core.compile_model(core.read_model(str(path)), "CPU", config).create_infer_request()
    config["PERF_COUNT"] = True  # slower runs: timed without it
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    shapes = ctb.ov_output_shapes(compiled)
    request = compiled.create_infer_request()
    fastest: dict[str, tuple[str, str, float]] = {}
    for _ in range(runs + 1):
        request.infer(feeds)
        for info in request.profiling_info:
            seconds = info.real_time.total_seconds()
            if seconds > 0:
                block = ov_block(info.node_type, info.exec_type, shapes.get(info.node_name, []))
                shape = "x".join(map(str, shapes.get(info.node_name, [])))
                kind = f"{block}: {info.node_type}/{info.exec_type} {shape}"
                old = fastest.get(info.node_name, ("", "", float("inf")))[2]
                fastest[info.node_name] = (block, kind, min(old, seconds))
    blocks: dict[str, float] = defaultdict(float)
    kinds: dict[str, float] = defaultdict(float)
    for block, kind, seconds in fastest.values():
        blocks[block] += seconds
        kinds[kind] += seconds
    return (lambda: plain.infer(feeds)), blocks, kinds


def profiled_run(prog: Any, feeds: dict, fastest: list[float]) -> None:
    """One run of `prog`, step by step, keeping each step's fastest wall time in `fastest`."""
    exe = prog._executable
    exe.executor.bind(feeds)
    with exe.scope():
        for i, fn in enumerate(exe.executor.steps):
            start = time.perf_counter()
            fn()
            fastest[i] = min(fastest[i], time.perf_counter() - start)
    exe.executor.collect()


def step_kinds(prog: Any, fastest: list[float]) -> dict[str, float]:
    """Seconds per step kind (block, op names, output shape) from each step's fastest time."""
    found: dict[str, float] = defaultdict(float)
    for step, seconds in zip(prog._executable.lowered.steps, fastest, strict=True):
        names = [i.op.name for i in step.instructions if i.op.name != "@literal"]
        shape = "x".join(map(str, step.instructions[-1].shape.lens()))
        found[f"{ctb.pgx_block(step)}: {','.join(names)[:50]} {shape}"] += seconds
    return found


def pgx_kinds(prog: Any, feeds: dict, runs: int) -> dict[str, float]:
    """Wall seconds of each step kind (its instructions' op names): each step's fastest run."""
    fastest = [float("inf")] * len(prog._executable.lowered.steps)
    for _ in range(runs):
        profiled_run(prog, feeds, fastest)
    return step_kinds(prog, fastest)


def wall_runs(fns: dict[str, Any], runs: int) -> tuple[dict[str, float], dict[str, int]]:
    """Median wall seconds per run of each engine, the engines alternating run by run."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - start)
    return {k: float(np.median(v)) for k, v in times.items()}, dict.fromkeys(fns, 0)


def print_kinds(title: str, kinds: dict[str, float]) -> None:
    print(f"  {title} (ms a run: sums of each node's fastest wall time):")
    for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:24]:
        print(f"    {v * 1e3:8.2f}  {k}")


def report(args: argparse.Namespace, total: dict, blocks: dict) -> None:
    """Median wall ms per run of each engine, and its blocks: sums of each node's fastest run
    (unscaled: the least disturbed figure on a shared machine)."""
    names = list(total)
    precision = "bf16" if args.bf16 else "float32"
    times = ", ".join(f"{k} {total[k] * 1e3:.1f}" for k in names)
    print(f"{args.model} b{args.batch} {precision}, {args.threads} thread(s), median wall ms a "
          f"run: {times} (OpenVINO timed without PERF_COUNT)")  # fmt: skip
    print(f"| block | {' | '.join(names)} | pgx - OV |")
    print("|---" * (len(names) + 2) + "|")
    for b in (*ctb.BLOCKS, "sum"):
        ms = [(sum(blocks[k].values()) if b == "sum" else blocks[k].get(b, 0.0)) * 1e3
              for k in names]  # fmt: skip
        print(f"| {b} | " + " | ".join(f"{m:.2f}" for m in ms) + f" | {ms[0] - ms[-1]:+.2f} |")


def model_arguments(
    ap: argparse.ArgumentParser, model: str = "bert_base", threads: int = 2, runs: int = 10
) -> None:
    """The options the bertb1 benchmarks share: --model, --batch, --threads, --runs, --bf16."""
    ap.add_argument("--model", default=model, choices=["bert_base", "gpt2"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=threads)
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--bf16", action="store_true")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model_arguments(ap)
    ap.add_argument("--nodes", action="store_true")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    data = model.SerializeToString()
    prog = ctb.compile_pgx(data, args)
    precision = "bf16" if args.bf16 else "f32"
    run_ov, ov_blocks, ov_kinds = openvino(model, precision, args.threads, args.runs, feeds)
    engines = {"pygraphx": lambda: prog.run(feeds)}
    blocks = {}
    if not args.bf16:
        engines["ORT"], blocks["ORT"] = ctb.ort_engine(data, args.threads, args.runs, feeds)
    engines["OpenVINO"] = run_ov
    total, faults = wall_runs(engines, args.runs)
    kinds = pgx_kinds(prog, feeds, args.runs)
    blocks["pygraphx"] = defaultdict(float)
    for k, v in kinds.items():
        blocks["pygraphx"][k.split(":")[0]] += v
    blocks["OpenVINO"] = ov_blocks
    report(args, total, {k: blocks[k] for k in engines})
    if args.nodes:
        print_kinds("pygraphx steps", kinds)
        print_kinds("OpenVINO nodes", ov_kinds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
