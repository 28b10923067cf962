"""pygraphx `cpu` against OpenVINO float32 or bf16, per op kind (helper gemm14; `--bf16`: gemm15).

    PYTHONPATH=. python benchmarks/gemm14_profile.py --model bert_base --threads 1 --runs 10
    PYTHONPATH=. python benchmarks/gemm14_profile.py --model minilm --threads 2

Models: `bert_base`, `gpt2` (`name:batch`) or a zoo model (`minilm`, `vit_b16`). Each of our
steps and each OpenVINO node (`PERF_COUNT`, real_time; cpu_time at one thread) is timed over
`--runs` runs, each keeps its fastest; at one thread ours is the step's thread CPU time (less
noise on a shared machine). Steps / nodes are put in kinds: `qkv` (a product whose output is
>= 2x its input width, no GELU, or the column parts), `ffn_up` (with GELU), `out_proj`
(768/384-wide products with the residual add), `ffn_down` (K = 4 N), `attention`, `layernorm`,
`views`, `other`; the table is ms a run per kind, ours against OpenVINO's.
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

from benchmarks.attn13_ab import load  # noqa: E402

KINDS = ("qkv", "ffn_up", "out_proj", "ffn_down", "lm_head", "attention", "layernorm", "views",
         "other")  # fmt: skip


def gemm_kind(k: int, n: int, names: list[str] | str) -> str:
    """The kind of a weight product of K = `k`, N = `n` (and its fused ops `names`)."""
    if n >= ctb.LM_HEAD_COLUMNS:
        return "lm_head"
    if "gelu" in names or "erf" in names or "tanh" in names or n == 4 * k:
        return "ffn_up"
    if k == 4 * n:
        return "ffn_down"
    if n >= 2 * k or "slice" in names:
        return "qkv"
    return "out_proj"


def pgx_kind(step: Any) -> str:
    block = ctb.pgx_block(step)
    if block not in ("gemm", "lm_head"):
        return block
    dot = step.instructions[0]
    k = dot.inputs[0].shape.lens()[-1]
    n = dot.shape.lens()[-1]
    names = [i.op.name for i in step.instructions]
    for i in step.instructions:
        if i.op.name == "pointwise":
            names += [j.op.name for j in i.module_inputs[0].instructions]
    if dot.outputs and dot.outputs[0].op.name == "slice" and n != k:
        names.append("slice")
    return gemm_kind(k, n, names)


def ov_kind(node_type: str, exec_type: str, inputs: list[list[int]], output: list[int]) -> str:
    if node_type == "Subgraph" and len(output) == 4:
        return "attention"
    block = ctb.ov_block(node_type, exec_type, output)
    if block not in ("gemm", "lm_head") or not output:
        return block
    k = inputs[0][-1] if inputs and inputs[0] else 0
    return gemm_kind(k, output[-1], "")


def ov_shapes(compiled: Any) -> dict[str, tuple[list[list[int]], list[int]]]:
    found = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        ins = []
        for j in range(op.get_input_size()):
            ps = op.get_input_partial_shape(j)
            ins.append([d.get_length() for d in ps] if ps.is_static else [])
        out = op.get_output_partial_shape(0) if op.get_output_size() else None
        outs = [d.get_length() for d in out] if out is not None and out.is_static else []
        found[op.get_friendly_name()] = (ins, outs)
    return found


def openvino(
    data: bytes, threads: int, runs: int, feeds: dict, precision: str = "f32"
) -> tuple[Any, dict, dict]:
    """OpenVINO f32: its plain run function, ms a run per kind, and per (kind, type/kernel,
    shape) (each node's fastest of `runs`: cpu_time at one thread, real_time else)."""
    import openvino as ov

    path = Path(scratch_dir()) / "model.onnx"
    path.write_bytes(data)
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads,
              "NUM_STREAMS": 1}  # fmt: skip
    plain = core.compile_model(core.read_model(str(path)), "CPU", config).create_infer_request()
    config["PERF_COUNT"] = True
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    shapes = ov_shapes(compiled)
    request = compiled.create_infer_request()
    fastest: dict[str, tuple[str, str, float]] = {}
    for _ in range(runs + 1):
        request.infer(feeds)
        for info in request.profiling_info:
            t = info.cpu_time if threads == 1 else info.real_time
            seconds = t.total_seconds()
            if seconds <= 0:
                continue
            ins, out = shapes.get(info.node_name, ([], []))
            kind = ov_kind(info.node_type, info.exec_type, ins, out)
            label = f"{kind}: {info.node_type}/{info.exec_type} {'x'.join(map(str, out))}"
            old = fastest.get(info.node_name, ("", "", float("inf")))[2]
            fastest[info.node_name] = (kind, label, min(old, seconds))
    kinds: dict[str, float] = defaultdict(float)
    labels: dict[str, float] = defaultdict(float)
    for kind, label, seconds in fastest.values():
        kinds[kind] += seconds
        labels[label] += seconds
    return (lambda: plain.infer(feeds)), kinds, labels


def pgx(prog: Any, feeds: dict, runs: int, clock: Any) -> tuple[dict, dict]:
    exe = prog._executable
    steps = exe.lowered.steps
    fastest = [float("inf")] * len(steps)
    for _ in range(runs + 1):
        exe.executor.bind(feeds)
        with exe.scope():
            for i, fn in enumerate(exe.executor.steps):
                start = clock()
                fn()
                fastest[i] = min(fastest[i], clock() - start)
        exe.executor.collect()
    kinds: dict[str, float] = defaultdict(float)
    labels: dict[str, float] = defaultdict(float)
    for step, seconds in zip(steps, fastest, strict=True):
        kind = pgx_kind(step)
        names = [i.op.name for i in step.instructions if i.op.name != "@literal"]
        shape = "x".join(map(str, step.instructions[-1].shape.lens()))
        kinds[kind] += seconds
        labels[f"{kind}: {','.join(names)[:40]} {shape}"] += seconds
    return kinds, labels


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bert_base")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--bf16", action="store_true", help="ours quantize_bf16, OpenVINO bf16")
    ap.add_argument("--labels", action="store_true", help="also list each node / step label")
    args = ap.parse_args(argv)
    import torch

    import pygraphx
    from pygraphx.targets.cpu.target import CpuTarget

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    data, feeds = load(args.model)
    prog = pygraphx.parse_onnx_buffer(data)
    if args.bf16:
        pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(threads=args.threads))
    run_ov, ov_kinds, ov_labels = openvino(
        data, args.threads, args.runs, feeds, "bf16" if args.bf16 else "f32"
    )
    walls: dict[str, list[float]] = {"pygraphx": [], "OpenVINO": []}
    fns = {"pygraphx": lambda: prog.run(feeds), "OpenVINO": run_ov}
    for fn in fns.values():
        fn()
    for _ in range(args.runs):
        for name, fn in fns.items():
            start = clock()
            fn()
            walls[name].append(clock() - start)
    pg_kinds, pg_labels = pgx(prog, feeds, args.runs, clock)
    what = "thread CPU" if args.threads == 1 else "wall"
    print(f"# {args.model} {'bf16' if args.bf16 else 'f32'}, {args.threads} thread(s), loadavg "
          f"{Path('/proc/loadavg').read_text().split()[:3]}; median {what} ms a run: "
          + ", ".join(f"{k} {np.median(v) * 1e3:.1f}" for k, v in walls.items()))  # fmt: skip
    print(f"| kind | pygraphx | OpenVINO | pgx - OV |  (ms a run, sums of each step's / node's "
          f"fastest {what} time)")  # fmt: skip
    print("|---|---|---|---|")
    for kind in (*KINDS, "sum"):
        a = (sum(pg_kinds.values()) if kind == "sum" else pg_kinds.get(kind, 0.0)) * 1e3
        b = (sum(ov_kinds.values()) if kind == "sum" else ov_kinds.get(kind, 0.0)) * 1e3
        print(f"| {kind} | {a:.2f} | {b:.2f} | {a - b:+.2f} |")
    if args.labels:
        for title, labels in (("pygraphx steps", pg_labels), ("OpenVINO nodes", ov_labels)):
            print(f"  {title}:")
            for k, v in sorted(labels.items(), key=lambda kv: -kv[1])[:30]:
                print(f"    {v * 1e3:8.2f}  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
