"""Transformer encoders (MiniLM, ViT-B/16, BERT-base) per group: pygraphx `cpu` against
OpenVINO float32 (`PERF_COUNT`) and ONNX Runtime (`enable_profiling`), helper tfov17.

    PYTHONPATH=. python benchmarks/tfov17_profile.py --models minilm vit_b16 bert_base:1 \
        --threads 1 --labels
    PYTHONPATH=. python benchmarks/tfov17_profile.py --models minilm vit_b16 --threads 2 \
        --wait-quiet 120

Groups: `qkv` (the query / key / value products; OpenVINO and ORT run three products, ours
one), `attention` (ours: the fused step; OpenVINO: its attention Subgraph and the transposes
around it; ORT: MatMuls of two activations, Softmax, the mask), `proj` (the attention's output
product; ours with the residual sum), `ffn_up` (with GELU), `ffn_down` (ours with the residual
sum), `norms`, `residuals` (OpenVINO's Subgraph after proj / ffn_down: the residual add and the
norm's affine part; ORT's Adds / SkipLayerNormalization is counted as `norms`), `other`
(embeddings, patch convolution, pooling, views). OpenVINO's and ORT's products are put in a
group by their ONNX node name (`query` / `key` / `value` or `q_proj` / ..., `attention/output`
or `o_proj`, `intermediate` or `fc1`, `output/dense` or `fc2`) where it has one, else by shape
as gemm14_profile does. Each step / node keeps its fastest of `--runs` runs (ours and
OpenVINO's: thread CPU time at one thread, wall time at two; ORT's profile is wall time
always: under load its rows swell); the "median run" line is each engine's median whole run
(engines alternating, the order reversed every round; OpenVINO without PERF_COUNT).
"""

from __future__ import annotations

import argparse
import json
import sys
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

GROUPS = ("qkv", "attention", "proj", "ffn_up", "ffn_down", "norms", "residuals", "other")


def by_name(name: str) -> str | None:
    """A product's group from its ONNX node name, or None."""
    n = name.lower()
    words = ("query", "key", "value", "q_proj", "k_proj", "v_proj")
    if any(f"/{w}/" in n or n.endswith(f"/{w}") for w in words):
        return "qkv"
    if "attention/output" in n or "/o_proj" in n:
        return "proj"
    if "intermediate" in n or "/fc1" in n:
        return "ffn_up"
    if "output/dense" in n or "/fc2" in n:
        return "ffn_down"
    return None


def pgx_group(kind: str) -> str:
    return {"out_proj": "proj", "layernorm": "norms", "views": "other", "lm_head": "other"}.get(
        kind, kind)


def openvino(data: bytes, threads: int, runs: int, feeds: dict) -> tuple[Any, dict, dict]:
    import openvino as ov

    path = Path(scratch_dir()) / "model.onnx"
    path.write_bytes(data)
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
              "NUM_STREAMS": 1}  # fmt: skip
    plain = core.compile_model(core.read_model(str(path)), "CPU", config).create_infer_request()
    config["PERF_COUNT"] = True
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    shapes = g14.ov_shapes(compiled)
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
            kind = pgx_group(g14.ov_kind(info.node_type, info.exec_type, ins, out))
            if info.node_type == "FullyConnected":
                kind = by_name(info.node_name) or kind
            elif info.node_type == "Transpose" and len(out) == 4:
                kind = "attention"
            elif info.node_type == "Subgraph" and len(out) == 3 and kind == "other":
                kind = "residuals"
            label = f"{kind}: {info.node_type}/{info.exec_type} {'x'.join(map(str, out))}"
            old = fastest.get(info.node_name, ("", "", float("inf")))[2]
            fastest[info.node_name] = (kind, label, min(old, seconds))
    return (lambda: plain.infer(feeds)), *_sum(fastest)


def _sum(fastest: dict) -> tuple[dict, dict]:
    groups: dict[str, float] = defaultdict(float)
    labels: dict[str, float] = defaultdict(float)
    for group, label, seconds in fastest.values():
        groups[group] += seconds
        labels[label] += seconds
    return groups, labels


def ort_engine(data: bytes, feeds: dict, threads: int, runs: int) -> tuple[Any, dict, dict]:
    import onnxruntime as ort

    def session(profile: bool) -> Any:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        if profile:
            opts.enable_profiling = True
            opts.profile_file_prefix = str(Path(scratch_dir()) / "ort")
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])

    plain, prof = session(False), session(True)
    for _ in range(runs + 1):
        prof.run(None, feeds)
    events = json.loads(Path(prof.end_profiling()).read_text())
    fastest: dict[str, tuple[str, str, float]] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        op = e["args"]["op_name"]
        out = [next(iter(s.values())) for s in e["args"].get("output_type_shape", [])]
        o = out[0] if out else []
        if op in ("MatMul", "Gemm", "FusedGemm", "FusedMatMul", "Add", "BiasGelu", "Gelu",
                  "FastGelu") and by_name(e["name"]):  # fmt: skip
            group = by_name(e["name"])
            if op == "Add" and group in ("proj", "ffn_down") and "/Add_1" in e["name"]:
                group = "residuals"
        elif op in ("MatMul", "FusedMatMul", "Softmax", "Where", "Attention",
                    "MultiHeadAttention"):  # fmt: skip
            group = "attention"
        elif op in ("Add", "Div") and len(o) == 4 and o[-1] == o[-2]:
            group = "attention"
        elif op in ("LayerNormalization", "SkipLayerNormalization"):
            group = "norms"
        elif op in ("Transpose", "Reshape") and len(o) == 4:
            group = "attention"
        else:
            group = "other"
        label = f"{group}: {op} {'x'.join(map(str, o))}"
        old = fastest.get(e["name"], ("", "", float("inf")))[2]
        fastest[e["name"]] = (group, label, min(old, e["dur"] * 1e-6))
    return (lambda: plain.run(None, feeds)), *_sum(fastest)


def wait_quiet(limit: float) -> str:
    """Wait up to `limit` s for /proc/stat busy < 15 % over 2 s; what was seen."""
    def busy() -> float:
        def read() -> tuple[int, int]:
            f = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
            return sum(f), f[3] + f[4]
        t0, i0 = read()
        time.sleep(2)
        t1, i1 = read()
        return 1 - (i1 - i0) / max(1, t1 - t0)
    end = time.time() + limit
    b = busy()
    while b >= 0.15 and time.time() < end:
        b = busy()
    return f"busy {b * 100:.0f} % over 2 s ({'quiet' if b < 0.15 else 'NOT quiet'})"


def profile(model: str, threads: int, runs: int, labels: bool, quiet: float) -> None:
    import pygraphx
    from pygraphx.targets.cpu.target import CpuTarget

    clock = time.thread_time if threads == 1 else time.perf_counter
    data, feeds = load(model)
    prog = pygraphx.parse_onnx_buffer(data)
    prog.compile(CpuTarget(threads=threads))
    seen = wait_quiet(quiet) if quiet else "no wait"  # (before every engine's profile)
    run_ov, ov_groups, ov_labels = openvino(data, threads, runs, feeds)
    run_ort, ort_groups, ort_labels = ort_engine(data, feeds, threads, runs)
    fns = {"pygraphx": lambda: prog.run(feeds), "OpenVINO": run_ov, "ORT": run_ort}
    walls: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for r in range(runs):
        for name in list(fns)[:: 1 if r % 2 == 0 else -1]:
            start = clock()
            fns[name]()
            walls[name].append(clock() - start)
    pg_kinds, pg_labels = g14.pgx(prog, feeds, runs, clock)
    pg_groups: dict[str, float] = defaultdict(float)
    for k, v in pg_kinds.items():
        pg_groups[pgx_group(k)] += v
    engines = {"pygraphx": (pg_groups, pg_labels), "OpenVINO": (ov_groups, ov_labels),
               "ORT": (ort_groups, ort_labels)}  # fmt: skip
    what = "thread CPU" if threads == 1 else "wall"
    print(f"# {model} float32, {threads} thread(s), {seen}, loadavg "
          f"{Path('/proc/loadavg').read_text().split()[:3]}; median {what} ms a run: "
          + ", ".join(f"{k} {np.median(v) * 1e3:.1f}" for k, v in walls.items()))  # fmt: skip
    print(f"| group | pygraphx | OpenVINO | ORT | pgx - OV |  (ms a run, sums of each step's / "
          f"node's fastest {what} time)")  # fmt: skip
    print("|---|---|---|---|---|")
    for group in (*GROUPS, "sum"):
        ms = [(sum(e[0].values()) if group == "sum" else e[0].get(group, 0.0)) * 1e3
              for e in engines.values()]  # fmt: skip
        print(f"| {group} | {ms[0]:.2f} | {ms[1]:.2f} | {ms[2]:.2f} | {ms[0] - ms[1]:+.2f} |")
    if labels:
        for name, (_, lab) in engines.items():
            print(f"  {name}:")
            for k, v in sorted(lab.items(), key=lambda kv: -kv[1])[:14]:
                print(f"    {v * 1e3:8.2f}  {k}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["minilm", "vit_b16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--labels", action="store_true")
    ap.add_argument("--wait-quiet", type=float, default=0.0)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    for model in args.models:
        profile(model, args.threads, args.runs, args.labels, args.wait_quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
