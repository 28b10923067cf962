"""GPT-2 (s128) per group: pygraphx `cpu` against ORT (`enable_profiling`) and OpenVINO
(`PERF_COUNT`), each group's GFLOP/s against the measured FMA peak, and the floor (helper gpt16).

    PYTHONPATH=. python benchmarks/gpt16_profile.py --threads 2 --batch 1 --runs 10
    PYTHONPATH=. python benchmarks/gpt16_profile.py --threads 2 --batch 8 --runs 3

Groups: `qkv` (768 -> 2304 with its bias / split), `attention` (ours: the fused step; ORT:
FusedMatMul / MatMul of two activations, Where, Softmax, the mask's Add; OpenVINO: its attention
Subgraph / MatMul / Softmax), `proj` (768 -> 768, ours with the residual sum), `ffn_up`
(768 -> 3072 with GELU: ORT's FastGelu counted here), `ffn_down` (3072 -> 768, ours with the
residual sum), `lm_head` (768 -> 50257), `norms`, `residuals` (ORT's separate residual Adds;
ours and OpenVINO's are fused into the product before them), `other` (views, gather, the mask).
Each step / node keeps its fastest of `--runs` runs (wall time at 2 threads, thread CPU time at
one); the "run" line is each engine's median run (the engines alternating, OpenVINO without
PERF_COUNT). The FMA peak is `benchmarks/gemm15_fma_peak.c` (24 register FMA chains; one copy
per thread, run at once), measured before and after the engines; GFLOP/s per group use the
products' dense FLOPs (attention: the full 128 x 128 scores, causal skipping not subtracted).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scratch import scratch_dir  # noqa: E402

import gemm14_profile as g14  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.attn13_ab import load  # noqa: E402

GROUPS = ("qkv", "attention", "proj", "ffn_up", "ffn_down", "lm_head", "norms", "residuals",
          "other")  # fmt: skip
D, S, LAYERS, HEADS, VOCAB = 768, 128, 12, 12, 50257


def flops(batch: int) -> dict[str, float]:
    """Dense FLOPs a run per group (2 per multiply-add)."""
    m = batch * S
    return {
        "qkv": 2 * m * D * 3 * D * LAYERS,
        "attention": 2 * 2 * batch * HEADS * S * S * (D // HEADS) * LAYERS,
        "proj": 2 * m * D * D * LAYERS,
        "ffn_up": 2 * m * D * 4 * D * LAYERS,
        "ffn_down": 2 * m * 4 * D * D * LAYERS,
        "lm_head": 2 * m * D * VOCAB,
    }


def fma_peak(copies: int) -> float:
    """GFLOP/s a core: `copies` copies of the probe at once, their median."""
    exe = Path(tempfile.gettempdir()) / "gpt16_fma_peak"
    src = Path(__file__).resolve().parent / "gemm15_fma_peak.c"
    if not exe.exists():
        subprocess.run(["gcc", "-O2", "-march=native", str(src), "-o", str(exe)], check=True)
    procs = [subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True)
             for _ in range(copies)]  # fmt: skip
    found = []
    for p in procs:
        out, _ = p.communicate()
        found.append(float(re.search(r"reg: ([\d.]+)", out).group(1)))
    return float(np.median(found))


def group_of(kind: str) -> str:
    return {"out_proj": "proj", "layernorm": "norms", "views": "other"}.get(kind, kind)


def ort_group(op: str, inputs: list[list[int]], output: list[int]) -> str:
    """ORT's node to a group, from its op and the shapes its profile lists."""
    if op in ("Gemm", "FusedGemm") or (op == "MatMul" and len(inputs) == 1):
        k = inputs[0][-1]
        return group_of(g14.gemm_kind(k, output[-1], ""))
    if op in ("FastGelu", "Gelu", "BiasGelu"):
        return "ffn_up"
    if op in ("MatMul", "FusedMatMul", "Softmax", "Where"):
        return "attention"
    if op == "Add" and len(output) == 4 and output[-1] == output[-2]:
        return "attention"  # the padding mask added to the scores
    if op in ("LayerNormalization", "SkipLayerNormalization"):
        return "norms"
    if op == "Add" and len(inputs) == 2 and inputs[0] == inputs[1] == output:
        return "residuals"
    return "other"


def ort_engine(data: bytes, feeds: dict, threads: int, runs: int) -> tuple[Any, dict, dict]:
    import onnxruntime as ort

    def session(profile: bool) -> Any:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        if profile:
            opts.enable_profiling = True
            opts.profile_file_prefix = str(Path(scratch_dir()) / "ort")
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])

    plain = session(False)
    prof = session(True)
    for _ in range(runs + 1):
        prof.run(None, feeds)
    events = json.loads(Path(prof.end_profiling()).read_text())
    fastest: dict[str, tuple[str, str, float]] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        ins = [next(iter(s.values())) for s in e["args"].get("input_type_shape", [])]
        out = [next(iter(s.values())) for s in e["args"].get("output_type_shape", [])]
        op = e["args"]["op_name"]
        group = ort_group(op, ins, out[0] if out else [])
        label = f"{group}: {op} {'x'.join(map(str, out[0] if out else []))}"
        old = fastest.get(e["name"], ("", "", float("inf")))[2]
        fastest[e["name"]] = (group, label, min(old, e["dur"] * 1e-6))
    groups: dict[str, float] = defaultdict(float)
    labels: dict[str, float] = defaultdict(float)
    for group, label, seconds in fastest.values():
        groups[group] += seconds
        labels[label] += seconds
    return (lambda: plain.run(None, feeds)), groups, labels


def regroup(kinds: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for k, v in kinds.items():
        out[group_of(k)] += v
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--no-ov", action="store_true")
    ap.add_argument("--labels", action="store_true")
    args = ap.parse_args(argv)
    import torch

    import pygraphx
    from pygraphx.targets.cpu.target import CpuTarget

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    peak_before = fma_peak(args.threads)
    data, feeds = load(f"gpt2:{args.batch}")
    prog = pygraphx.parse_onnx_buffer(data)
    prog.compile(CpuTarget(threads=args.threads))
    fns: dict[str, Any] = {"pygraphx": lambda: prog.run(feeds)}
    run_ort, ort_groups, ort_labels = ort_engine(data, feeds, args.threads, args.runs)
    fns["ORT"] = run_ort
    engines = {"ORT": (ort_groups, ort_labels)}
    if not args.no_ov:
        run_ov, ov_kinds, ov_labels = g14.openvino(data, args.threads, args.runs, feeds)
        fns["OpenVINO"] = run_ov
        engines["OpenVINO"] = (regroup(ov_kinds), ov_labels)
    walls: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for r in range(args.runs):
        for name in list(fns)[:: 1 if r % 2 == 0 else -1]:
            start = clock()
            fns[name]()
            walls[name].append(clock() - start)
    pg_kinds, pg_labels = g14.pgx(prog, feeds, args.runs, clock)
    engines = {"pygraphx": (regroup(pg_kinds), pg_labels), **engines}
    peak_after = fma_peak(args.threads)
    peak = max(peak_before, peak_after) * args.threads
    fl = flops(args.batch)
    total = sum(fl.values())
    what = "thread CPU" if args.threads == 1 else "wall"
    print(f"# gpt2 b{args.batch} float32, {args.threads} thread(s), loadavg "
          f"{Path('/proc/loadavg').read_text().split()[:3]}; median {what} ms a run: "
          + ", ".join(f"{k} {np.median(v) * 1e3:.1f}" for k, v in walls.items()))  # fmt: skip
    print(f"# FMA peak {peak_before:.1f} before / {peak_after:.1f} after GFLOP/s a core; "
          f"{args.threads} core(s): {peak:.1f}; dense FLOPs {total / 1e9:.2f} G; floor "
          f"(FLOPs / peak) {total / peak / 1e6:.1f} ms")  # fmt: skip
    names = list(engines)
    print("| group | GFLOP | " + " | ".join(f"{n} ms" for n in names) + " | "
          + " | ".join(f"{n} GFLOP/s (% peak)" for n in names) + " |")  # fmt: skip
    print("|---" * (2 + 2 * len(names)) + "|")
    for group in (*GROUPS, "sum"):
        ms = [(sum(engines[n][0].values()) if group == "sum" else engines[n][0].get(group, 0.0))
              * 1e3 for n in names]  # fmt: skip
        gf = total if group == "sum" else fl.get(group, 0.0)
        rates = [f"{gf / t / 1e6:.1f} ({gf / t / 1e6 / peak * 100:.0f} %)" if gf and t else "-"
                 for t in ms]  # fmt: skip
        print(f"| {group} | {gf / 1e9:.2f} | " + " | ".join(f"{t:.2f}" for t in ms) + " | "
              + " | ".join(rates) + " |")  # fmt: skip
    if args.labels:
        for name in names:
            print(f"  {name}:")
            for k, v in sorted(engines[name][1].items(), key=lambda kv: -kv[1])[:20]:
                print(f"    {v * 1e3:8.2f}  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
