"""Where a transformer's time goes, block by block, on the `cpu` target and in ONNX Runtime.

    python benchmarks/cpu_transformer_blocks.py                       # bert_base, batch 1
    python benchmarks/cpu_transformer_blocks.py --model gpt2 --batch 8 --runs 3
    python benchmarks/cpu_transformer_blocks.py --model gpt2 --batch 8 --keep-freed-memory
    python benchmarks/cpu_transformer_blocks.py --bf16                # against OpenVINO bf16
    python benchmarks/cpu_transformer_blocks.py --bf16 --compare-attention --runs 15

One thread for both engines by default (ORT: `intra_op_num_threads=1`,
`inter_op_num_threads=1`), each engine's run timed by process CPU time (user + system,
`getrusage`: robust on a machine shared with other work, and it counts the page faults of fresh
outputs), the engines alternating run by run. Blocks:

* pygraphx: the fast path's own steps (a GEMM with its bias / GELU / residual add, an attention
  block or a layer normalisation is one step), each timed by the thread's CPU time, then the
  per-block sums scaled to the run's CPU time (the rest is the executor and the outputs).
* ORT: its profiler's per-node times (`enable_profiling`), the fastest of the runs for each node
  (wall time: a node's fastest run is the one least disturbed by other work), scaled so that
  their sum is ORT's CPU time per run.

With `--bf16` pygraphx runs the program `quantize_bf16` makes (the driver's `--bf16`) and the
peer is OpenVINO at bf16 (`INFERENCE_PRECISION_HINT=bf16`, one stream, `INFERENCE_NUM_THREADS`):
its per-node profile (`PERF_COUNT`, the fastest run of each node, scaled like ORT's) in blocks:
FullyConnected is `gemm` / `lm_head`, a bf16 `Subgraph` (its fused attention) `attention`,
MVN `layernorm`, Reorder / Transpose / Reshape / Split `views`. `--no-onednn-attention`
compiles pygraphx with `onednn_attention=False` (torch's route for bf16 attention);
`--compare-attention` runs both, alternating with the peer in one process;
`--compare-layernorm` likewise with `PGX_CPU_LAYERNORM=torch` (torch's layer-norm kernel).
`--threads N` runs both engines on N threads (the CPU times then include the threads' waits).

Block kinds: `gemm` (products with a fixed weight, with their bias and activation; ORT's Gemm,
FusedGemm, MatMul with a 2-D weight, Gelu / FastGelu), `lm_head` (a weight product with at least
10,000 output columns), `attention` (ours: the fused step; ORT: FusedMatMul / MatMul of two
activations, Softmax, Where), `layernorm` (ORT's LayerNormalization and SkipLayerNormalization,
which holds the residual add our GEMM step takes), `views` (reshape / transpose / slice / split /
squeeze / unsqueeze), `other`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scratch import scratch_dir  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_layernorm import (  # noqa: E402
    KERNEL_ENV as LAYERNORM_ENV,
)

VIEWS = {"reshape", "transpose", "slice", "split", "squeeze", "unsqueeze", "Reshape", "Transpose",
         "Slice", "Split", "Squeeze", "Unsqueeze", "multibroadcast", "contiguous"}  # fmt: skip
LM_HEAD_COLUMNS = 10_000
BLOCKS = ("gemm", "lm_head", "attention", "layernorm", "views", "other")


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pgx_block(step: Any) -> str:
    names = [i.op.name for i in step.instructions]
    if names.count("dot") == 2 and "fused_reduce" in names:
        return "attention"
    if "reduce_mean" in names and len(names) > 3:
        return "layernorm"
    if names[0] == "dot":
        return "lm_head" if step.instructions[0].shape.lens()[-1] >= LM_HEAD_COLUMNS else "gemm"
    return "views" if set(names) <= VIEWS else "other"


def ort_block(op: str, inputs: list[list[int]], output: list[int]) -> str:
    """The block of an ORT node from its op and the shapes its profile lists (`inputs`: the
    run-time inputs only, a weight is not listed)."""
    if op in ("Gemm", "FusedGemm", "Gelu", "FastGelu", "BiasGelu"):
        return "gemm"
    if op == "MatMul" and len(inputs) == 1:  # the other operand is a weight
        return "lm_head" if output and output[-1] >= LM_HEAD_COLUMNS else "gemm"
    if op in ("MatMul", "FusedMatMul", "Softmax", "Where"):
        return "attention"
    if op in ("LayerNormalization", "SkipLayerNormalization"):
        return "layernorm"
    return "views" if op in VIEWS else "other"


OV_VIEWS = {"Reorder", "Transpose", "Reshape", "Split", "VariadicSplit", "Squeeze", "Unsqueeze",
            "Concat", "Gather", "ShapeOf"}  # fmt: skip


def ov_block(node_type: str, exec_type: str, output: list[int]) -> str:
    """The block of an OpenVINO node from its type, its kernel and its output shape."""
    if node_type == "FullyConnected":
        return "lm_head" if output and output[-1] >= LM_HEAD_COLUMNS else "gemm"
    if node_type in ("Subgraph", "ScaledDotProductAttention") and "bf16" in exec_type:
        return "attention"
    if node_type in ("MatMul", "Softmax", "ScaledDotProductAttention"):
        return "attention"
    if node_type == "MVN":
        return "layernorm"
    return "views" if node_type in OV_VIEWS else "other"


def pgx_profile(prog: pygraphx.Program, feeds: dict, runs: int) -> dict[str, float]:
    """CPU seconds per block per run (unscaled) from the fast path's steps."""
    exe = prog._executable
    steps, fns = exe.lowered.steps, exe.executor.steps
    found: dict[str, float] = defaultdict(float)
    clock = time.thread_time
    for _ in range(runs):
        exe.executor.bind(feeds)
        with exe.scope():
            for step, fn in zip(steps, fns, strict=True):
                start = clock()
                fn()
                found[pgx_block(step)] += (clock() - start) / runs
        exe.executor.collect()
    return found


def ort_profile(model_bytes: bytes, feeds: dict, runs: int, threads: int = 1) -> dict[str, float]:
    """Seconds per block per run (unscaled): each node's fastest profiled run."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(scratch_dir()) / "ort")
    sess = ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])
    for _ in range(runs + 1):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    fastest: dict[str, tuple[str, float]] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        shapes = [next(iter(s.values())) for s in e["args"].get("input_type_shape", [])]
        out = [next(iter(s.values())) for s in e["args"].get("output_type_shape", [])]
        block = ort_block(e["args"]["op_name"], shapes, out[0] if out else [])
        old = fastest.get(e["name"], (block, float("inf")))[1]
        fastest[e["name"]] = (block, min(old, e["dur"] * 1e-6))
    found: dict[str, float] = defaultdict(float)
    for block, seconds in fastest.values():
        found[block] += seconds
    return found


def ov_output_shapes(compiled: Any) -> dict[str, list[int]]:
    """Each node of OpenVINO's compiled runtime model by name: its first output's static
    shape ([] when dynamic or none)."""
    shapes = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        out = op.get_output_partial_shape(0) if op.get_output_size() else None
        static = out is not None and out.is_static
        shapes[op.get_friendly_name()] = [d.get_length() for d in out] if static else []
    return shapes


def openvino_engine(model: Any, threads: int, runs: int, feeds: dict) -> tuple[Any, dict]:
    """OpenVINO at bf16 on `threads`: its run function and seconds per block per run
    (unscaled: each node's fastest of `runs` profiled runs)."""
    import openvino as ov

    path = Path(scratch_dir()) / "model.onnx"
    path.write_bytes(model.SerializeToString())
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": threads,
              "NUM_STREAMS": 1, "PERF_COUNT": True}  # fmt: skip
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    shapes = ov_output_shapes(compiled)
    request = compiled.create_infer_request()
    fastest: dict[str, tuple[str, float]] = {}
    for _ in range(runs + 1):
        request.infer(feeds)
        for info in request.profiling_info:
            seconds = info.real_time.total_seconds()
            if seconds > 0:
                shape = shapes.get(info.node_name, [])
                block = ov_block(info.node_type, info.exec_type, shape)
                old = fastest.get(info.node_name, (block, float("inf")))[1]
                fastest[info.node_name] = (block, min(old, seconds))
    found: dict[str, float] = defaultdict(float)
    for block, seconds in fastest.values():
        found[block] += seconds
    return (lambda: request.infer(feeds)), found


def timed_runs(fns: dict[str, Any], runs: int) -> tuple[dict[str, float], dict[str, int]]:
    """Median CPU seconds per run of each engine, the engines alternating, and each engine's
    minor page faults per run (a fresh output the allocator maps anew faults every run)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    faults = dict.fromkeys(fns, 0)
    for _ in range(runs):
        for k, fn in fns.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = cpu_seconds()
            out = fn()
            times[k].append(cpu_seconds() - start)
            faults[k] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            del out
    return {k: float(np.median(v)) for k, v in times.items()}, {
        k: n // runs for k, n in faults.items()
    }


def keep_freed_memory() -> None:
    """glibc: serve allocations up to 256 MiB from the heap and keep up to 512 MiB freed at its
    top, so a large output freed by the caller is reused by the next run without page faults
    (process-wide: an experiment, `--keep-freed-memory`)."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    if not (
        libc.mallopt(m_mmap_threshold, 256 << 20) and libc.mallopt(m_trim_threshold, 512 << 20)
    ):
        raise RuntimeError("mallopt refused the thresholds")


def ort_engine(data: bytes, threads: int, runs: int, feeds: dict) -> tuple[Any, dict]:
    """ONNX Runtime on `threads`: its run function and seconds per block per run."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    return (lambda: sess.run(None, feeds)), ort_profile(data, feeds, runs, threads)


def compile_pgx(data: bytes, args: argparse.Namespace, **settings: Any) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(data)
    if args.bf16:
        pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(threads=args.threads, **settings))
    return prog


def report(args: argparse.Namespace, total: dict, faults: dict, blocks: dict) -> None:
    """The per-run CPU times and the blocks of every engine, the first one's differences to
    the last's (the peer)."""
    names = list(total)
    first, peer = names[0], names[-1]
    precision = "bf16" if args.bf16 else "float32"
    times = ", ".join(f"{k} {total[k] * 1e3:.1f}" for k in names)
    print(f"{args.model} batch {args.batch} {precision}, {args.threads} thread(s), CPU ms per "
          f"run: {times} ({first}/{peer} {total[first] / total[peer]:.3f}x); minor page faults "
          f"per run: " + ", ".join(f"{k} {faults[k]}" for k in names))  # fmt: skip
    print(f"{'block':10s} " + " ".join(f"{k[:12]:>12s}" for k in names) + "     diff   (ms, "
          "scaled to the run)")  # fmt: skip
    scaled = {k: {b: v * total[k] / sum(blocks[k].values()) for b, v in blocks[k].items()}
              for k in blocks}  # fmt: skip
    for b in BLOCKS:
        ms = [scaled[k].get(b, 0.0) * 1e3 for k in names]
        print(f"{b:10s} " + " ".join(f"{m:12.2f}" for m in ms) + f" {ms[0] - ms[-1]:+8.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bert_base", choices=["bert_base", "gpt2"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bf16", action="store_true", help="pygraphx bf16 against OpenVINO bf16")
    ap.add_argument("--no-onednn-attention", action="store_true")
    ap.add_argument("--compare-attention", action="store_true",
                    help="also pygraphx with onednn_attention=False, alternating")  # fmt: skip
    ap.add_argument("--compare-layernorm", action="store_true",
                    help="also pygraphx with PGX_CPU_LAYERNORM=torch, alternating")  # fmt: skip
    ap.add_argument("--keep-freed-memory", action="store_true", help="see keep_freed_memory()")
    args = ap.parse_args(argv)
    if args.keep_freed_memory:
        keep_freed_memory()
    import torch

    torch.set_num_threads(args.threads)
    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    data = model.SerializeToString()
    off = {"onednn_attention": False}
    progs = {"pygraphx": compile_pgx(data, args, **(off if args.no_onednn_attention else {}))}
    if args.compare_attention:
        progs["pgx_torch_attn"] = compile_pgx(data, args, **off)
    if args.compare_layernorm:
        os.environ[LAYERNORM_ENV] = "torch"
        progs["pgx_torch_ln"] = compile_pgx(data, args)
        del os.environ[LAYERNORM_ENV]
    peer = "OpenVINO" if args.bf16 else "ORT"
    make = openvino_engine if args.bf16 else ort_engine
    run_peer, peer_blocks = make(model if args.bf16 else data, args.threads, args.runs, feeds)
    engines = {k: (lambda p=p: p.run(feeds)) for k, p in progs.items()}
    total, faults = timed_runs({**engines, peer: run_peer}, args.runs)
    blocks = {k: pgx_profile(p, feeds, args.runs) for k, p in progs.items()}
    report(args, total, faults, {**blocks, peer: peer_blocks})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
