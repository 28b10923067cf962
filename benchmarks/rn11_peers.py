"""ResNet-50's convolutions by kind in ONNX Runtime (its profiler's per-node times,
`enable_profiling`) and OpenVINO (`PERF_COUNT`: per-layer times and the kernel it ran), with
each kind's GFLOP/s; compare with `benchmarks/wino2_steps.py` (pygraphx's steps, same kinds).
Per node the fastest of `--runs` runs is kept (noise from other processes only adds).

    python benchmarks/rn11_peers.py --batch 1 --threads 1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scratch import scratch_dir  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.cpu_engines import profiled_openvino  # noqa: E402
from pygraphx.models import get_model  # noqa: E402


def kind_of(x: list[int], w: list[int], out: list[int], stride: int) -> tuple[str, float]:
    """(kind as wino2_steps names it, direct multiply-adds) of a convolution."""
    c, kh, kw = x[1], w[-2], w[-1]
    wide = " cin>=256" if c >= 256 and (kh, kw) == (1, 1) else ""
    macs = float(np.prod(out)) * c * kh * kw
    return f"conv {kh}x{kw} s{stride}{wide}", macs


def conv_table(model) -> dict[str, tuple[str, float, str]]:
    """Node name -> (kind, multiply-adds, layer) for every Conv of the ONNX model."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    for init in model.graph.initializer:
        shapes[init.name] = list(init.dims)
    table = {}
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        strides = next((list(a.ints) for a in node.attribute if a.name == "strides"), [1, 1])
        x, w, out = shapes[node.input[0]], shapes[node.input[1]], shapes[node.output[0]]
        kind, macs = kind_of(x, w, out, strides[0])
        table[node.name] = (kind, macs, f"({x[1]},{x[2]},{x[3]})->{w[0]} s{strides[0]}")
    return _with_epilogues(model, table)


def _with_epilogues(model, table: dict) -> dict:
    """`table` also under the names (node and output, with ORT's "_nchwc" suffix) of each
    convolution's BatchNormalization / Relu / Add epilogue, which the runtimes fuse into it and
    name it after."""
    consumers: dict[str, list] = defaultdict(list)
    for node in model.graph.node:
        for name in node.input:
            consumers[name].append(node)
    out = dict(table)
    for node in model.graph.node:
        if node.name not in table:
            continue
        entry, cur = table[node.name], node
        while True:
            for name in (cur.name, cur.output[0], cur.output[0] + "_nchwc"):
                out.setdefault(name, entry)
            nxt = consumers.get(cur.output[0], [])
            if len(nxt) != 1 or nxt[0].op_type not in ("BatchNormalization", "Relu", "Add"):
                break
            cur = nxt[0]
    return out


def ort_times(model, feeds: dict, threads: int, runs: int) -> dict[str, float]:
    """Node name -> best seconds per run in ONNX Runtime's profile."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(scratch_dir(), "ort")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for _ in range(3):
        sess.run(None, feeds)
    per_run: dict[str, list[float]] = defaultdict(list)
    for _ in range(runs):
        sess.run(None, feeds)
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    for ev in events:
        if ev.get("cat") == "Node" and ev["name"].endswith("_kernel_time"):
            name = ev["name"][: -len("_kernel_time")]
            per_run[name + "|" + ev["args"].get("op_name", "")].append(ev["dur"] * 1e-6)
    # the warm-up runs are in the profile too: the fastest of all
    return {k: min(v) for k, v in per_run.items()}


def ov_times(
    model, feeds: dict, threads: int, runs: int, known: dict
) -> dict[str, tuple[float, str, str]]:
    """Layer name -> (best seconds, layer type, OpenVINO's kernel) in OpenVINO's PERF_COUNT;
    a layer that fused ONNX nodes named in `known` is named after the first of them."""
    compiled = profiled_openvino(model, threads, "f32")
    req = compiled.create_infer_request()
    # a layer's name is OpenVINO's own; the ONNX nodes fused into it are in its run-time info
    original = {}
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if "originalLayersNames" in info:
            names = str(info["originalLayersNames"].astype(str)).split(",")
            original[op.get_friendly_name()] = next((n for n in names if n in known), "")
    best: dict[str, tuple[float, str, str]] = {}
    for _ in range(3 + runs):
        req.infer(list(feeds.values()))
        for info in req.get_profiling_info():
            sec = info.real_time.total_seconds()
            if info.status.name != "EXECUTED":
                continue
            name = original.get(info.node_name) or info.node_name
            old = best.get(name)
            if old is None or sec < old[0]:
                best[name] = (sec, info.node_type, info.exec_type)
    return best


def report(title: str, rows: list[tuple[str, float, float]]) -> None:
    """Per kind: n, ms, share, GFLOP/s."""
    kinds: dict = defaultdict(lambda: [0.0, 0, 0.0])
    for kind, sec, macs in rows:
        r = kinds[kind]
        r[0], r[1], r[2] = r[0] + sec, r[1] + 1, r[2] + macs
    total = sum(r[0] for r in kinds.values())
    print(f"## {title}: total {total * 1e3:.2f} ms")
    for kind, (sec, n, macs) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        rate = 2 * macs / sec / 1e9 if macs else 0.0
        print(f"{kind:40s} n={n:3d} {sec * 1e3:8.2f} ms ({sec / total:5.1%}) {rate:6.1f} GFLOP/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--layers", action="store_true", help="print every layer")
    args = ap.parse_args()
    model = get_model("resnet50", batch=args.batch)
    model.ir_version = min(model.ir_version, 10)
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    feeds = {model.graph.input[0].name: x}
    convs = conv_table(model)
    ort_rows, ov_rows, layers = [], [], defaultdict(dict)
    for key, sec in ort_times(model, feeds, args.threads, args.runs).items():
        name, op = key.split("|")
        kind, macs, layer = convs.get(name, (f"other:{op}", 0.0, ""))
        ort_rows.append((kind, sec, macs))
        if layer:
            layers[name]["ort"] = (sec, op, layer, macs)
    have_ov = importlib.util.find_spec("openvino") is not None
    ov = ov_times(model, feeds, args.threads, args.runs, convs) if have_ov else {}
    if not have_ov:
        print("(openvino is not installed: its column is left out)")
    for name, (sec, typ, exec_type) in ov.items():
        kind, macs, layer = convs.get(name, (f"other:{typ}", 0.0, ""))
        ov_rows.append((kind, sec, macs))
        if layer:
            layers[name]["ov"] = (sec, exec_type, layer, macs)
    report(f"onnxruntime b{args.batch} t{args.threads}", ort_rows)
    report(f"openvino f32 b{args.batch} t{args.threads}", ov_rows)
    if args.layers:
        for name, d in layers.items():
            line = [name]
            for who in ("ort", "ov"):
                if who in d:
                    sec, impl, layer, macs = d[who]
                    rate = 2 * macs / sec / 1e9
                    line.append(f"{who} {layer} {sec * 1e3:.3f} ms {impl} {rate:.0f} GF/s")
            print(" | ".join(line))


if __name__ == "__main__":
    main()
