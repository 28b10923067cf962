"""MobileNetV2 per layer: pygraphx's cpu steps against ONNX Runtime's nodes, in one process.

    python benchmarks/mnv2dw_layers.py --threads 1 --runs 200
    python benchmarks/mnv2dw_layers.py --threads 2 --batch 8 --runs 40
    python benchmarks/mnv2dw_layers.py --threads 2 --batch 1 --runs 100 --ov   # + OpenVINO f32

`--bf16`: pygraphx `quantize_bf16`'d and OpenVINO at bf16 (ORT stays float32).
`--ov`: OpenVINO f32's PERF_COUNT too (each layer's median `real_time`, its kernel), its
convolution layers paired by run order like ORT's. Also printed: each runtime's whole-run wall
(median of `--runs` runs) against its steps' / nodes' sum, the time outside them (at 1 thread
pygraphx's steps are thread CPU time against a wall: only indicative there).

pygraphx: the cpu target's fast-path steps timed as they run (as `targets.cpu.profile` does;
thread CPU time at 1 thread), each convolution step with its fused epilogue (a fused 1x1 +
depthwise step: its time on the 1x1 row, 0 on the depthwise one). ORT:
`SessionOptions.enable_profiling`, each node's median `dur` over the runs (its fused Conv
nodes carry the epilogue; its NCHWc reorders are listed apart). The n-th convolution of one
is paired with the n-th of the other (both run the graph's convolutions in the same order).
ORT's times are wall clock, so a loaded machine inflates them; pygraphx's at 2 threads too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scratch import scratch_dir  # noqa: E402

import pygraphx  # noqa: E402
from benchmarks.cpu_engines import profiled_openvino  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402


def run_wall(run: object, runs: int) -> float:
    """Median wall ms of `runs` calls of `run()` (after 5 warm-up calls)."""
    import time

    for _ in range(5):
        run()
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        walls.append(time.perf_counter() - t0)
    return float(np.median(walls)) * 1e3


def ours(
    model: object, threads: int, feeds: dict, runs: int, blocks: int, bf16: bool = False
) -> list[dict]:
    """Per convolution: its step's ops, its lens, mean ms of its step (best of `blocks` blocks
    of `runs` runs; thread CPU time at 1 thread, else wall)."""
    import time

    from pygraphx.targets.cpu.profile import time_steps
    from pygraphx.targets.cpu.target import CpuTarget

    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    if bf16:
        pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(threads=threads))
    for _ in range(5):
        prog.run(feeds)
    exe = prog._executable
    clock = time.thread_time if threads == 1 else time.perf_counter
    acc: list[float] | None = None
    steps = []
    for _ in range(blocks):
        steps = time_steps(exe, feeds, runs, clock)
        secs = [s.seconds for s in steps]
        acc = secs if acc is None else [min(a, b) for a, b in zip(acc, secs, strict=True)]
    out = []
    for s, sec in zip(steps, acc or [], strict=True):
        ops = [i.op.name for i in s.instructions if not i.is_literal()]
        convs = [i for i in s.instructions if i.op.name == "convolution"] or [None]
        for k, conv in enumerate(convs):  # a fused 1x1 + depthwise step: its time on the first
            desc = ""
            if conv is not None:
                x, w = (list(i.shape.lens()) for i in conv.inputs[:2])
                desc = f"x{x} w{w} s{list(conv.op.stride)} g{conv.op.group}"
                desc += " (fused with the one before)" if k else ""
            ms = 0.0 if k else sec * 1e3
            out.append({"ops": "+".join(dict.fromkeys(ops)), "layer": desc, "ms": ms})
    out.append({"ops": "_run_wall", "layer": "", "ms": run_wall(lambda: prog.run(feeds), runs)})
    return out


def openvino_rows(
    model: object, threads: int, feeds: dict, runs: int, precision: str = "f32"
) -> list[dict]:
    """Per OpenVINO f32 layer executed, in its profile's order: name, type, kernel, median ms
    over `runs` runs (PERF_COUNT's `real_time`); last a `_run_wall` row."""
    compiled = profiled_openvino(model, threads, precision)
    req = compiled.create_infer_request()
    inputs = list(feeds.values())
    times: dict[str, list[float]] = {}
    meta: dict[str, tuple[str, str]] = {}
    for k in range(runs + 5):
        req.infer(inputs)
        if k < 5:
            continue
        for info in req.get_profiling_info():
            if info.status.name != "EXECUTED":
                continue
            times.setdefault(info.node_name, []).append(info.real_time.total_seconds())
            meta[info.node_name] = (info.node_type, info.exec_type)
    out = [
        {"name": n, "op": meta[n][0], "impl": meta[n][1], "ms": float(np.median(t)) * 1e3}
        for n, t in times.items()
    ]
    out.append({"name": "_run_wall", "op": "_run_wall", "impl": "",
                "ms": run_wall(lambda: req.infer(inputs), runs)})
    return out


def theirs(model: object, threads: int, feeds: dict, runs: int) -> list[dict]:
    """Per ORT node in run order: name, op, median ms over `runs` (after 10 warm-up runs)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(scratch_dir(), "ort")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for _ in range(runs + 10):
        sess.run(None, feeds)
    events = [e for e in json.load(open(sess.end_profiling())) if e.get("cat") == "Node"]
    order: dict[str, dict] = {}
    for e in events:
        if not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        row = order.setdefault(name, {"name": name, "op": e["args"]["op_name"], "us": []})
        row["us"].append(e["dur"])
    out = []
    for row in order.values():
        us = row["us"][10:]  # the first 10 runs warm up
        out.append({"name": row["name"], "op": row["op"], "ms": float(np.median(us)) / 1e3})
    out.append({"name": "_run_wall", "op": "_run_wall",
                "ms": run_wall(lambda: sess.run(None, feeds), runs)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--ov", action="store_true", help="OpenVINO f32's PERF_COUNT too")
    p.add_argument(
        "--bf16", action="store_true", help="pygraphx quantize_bf16'd, OpenVINO bf16 (ORT f32)"
    )
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = get_model("mobilenetv2", batch=args.batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs("mobilenetv2", model).items()}
    mine = ours(model, args.threads, feeds, args.runs, args.blocks, args.bf16)
    ort_rows = theirs(model, args.threads, feeds, args.runs * args.blocks)
    precision = "bf16" if args.bf16 else "f32"
    ov_rows = (
        openvino_rows(model, args.threads, feeds, args.runs * args.blocks, precision)
        if args.ov
        else []
    )
    walls = {
        "pygraphx": mine.pop()["ms"],
        "ort": ort_rows.pop()["ms"],
        **({"ov": ov_rows.pop()["ms"]} if ov_rows else {}),
    }
    our_convs = [r for r in mine if "convolution" in r["ops"]]
    ort_convs = [r for r in ort_rows if "Conv" in r["op"]]
    ov_convs = [r for r in ov_rows if "Convolution" in r["op"]]
    print(f"threads {args.threads} batch {args.batch}{' bf16 (ORT f32)' if args.bf16 else ''}")
    head = f"{'#':>3} {'pygraphx ms':>11} {'ort ms':>8} {'ratio':>6}"
    ov_head = f" {'ov ms':>8} {'ratio':>6}" if ov_rows else ""
    print(head + ov_head + "  layer / ort op / ov kernel")
    for k, (a, b) in enumerate(zip(our_convs, ort_convs, strict=False)):
        ratio = a["ms"] / max(b["ms"], 1e-9)
        line = f"{k:3d} {a['ms']:11.4f} {b['ms']:8.4f} {ratio:6.2f}"
        tail = ""
        if k < len(ov_convs):
            c = ov_convs[k]
            line += f" {c['ms']:8.4f} {a['ms'] / max(c['ms'], 1e-9):6.2f}"
            tail = f" {c['impl']}"
        print(f"{line}  {a['layer']} {b['op']}{tail}")
    rest_ours = [r for r in mine if "convolution" not in r["ops"]]
    rest_ort = [r for r in ort_rows if "Conv" not in r["op"]]
    rest_ov = [r for r in ov_rows if "Convolution" not in r["op"]]
    print("pygraphx other steps:", [(r["ops"], round(r["ms"], 4)) for r in rest_ours])
    print("ort other nodes:", [(r["op"], round(r["ms"], 4)) for r in rest_ort])
    if ov_rows:
        print("ov other layers:", [(r["op"], r["impl"], round(r["ms"], 4)) for r in rest_ov])
    tot = {
        "pygraphx_conv": sum(r["ms"] for r in our_convs),
        "ort_conv": sum(r["ms"] for r in ort_convs),
        "pygraphx_rest": sum(r["ms"] for r in rest_ours),
        "ort_rest": sum(r["ms"] for r in rest_ort),
    }
    if ov_rows:
        tot["ov_conv"] = sum(r["ms"] for r in ov_convs)
        tot["ov_rest"] = sum(r["ms"] for r in rest_ov)
    tot["pygraphx_wall"] = walls["pygraphx"]
    tot["pygraphx_outside_steps"] = walls["pygraphx"] - tot["pygraphx_conv"] - tot["pygraphx_rest"]
    tot["ort_wall"] = walls["ort"]
    tot["ort_outside_nodes"] = walls["ort"] - tot["ort_conv"] - tot["ort_rest"]
    if ov_rows:
        tot["ov_wall"] = walls["ov"]
        tot["ov_outside_layers"] = walls["ov"] - tot["ov_conv"] - tot["ov_rest"]
    print({k: round(v, 3) for k, v in tot.items()})
    print("(loadavg at the end:", Path("/proc/loadavg").read_text().split()[:3], ")")
    if args.json:
        rows = {"ours": mine, "ort": ort_rows, "ov": ov_rows, "totals": tot}
        Path(args.json).write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
