"""MobileNetV2 float32: where pygraphx's run goes, step by step, against ONNX Runtime's own
profiler per node (helper mnv15, issue 10).

    python benchmarks/mnv15_profile.py --threads 2 --batch 1 --runs 60 [--env K=V ...]

pygraphx: `profile.time_steps` (the fast path's own steps), each step's minimum over `--runs`
runs of wall time (and, at 1 thread, thread CPU time); the whole run's minimum wall time without
per-step timing (the difference: the executor's own time between steps). ORT:
`SessionOptions.enable_profiling`, each node's minimum duration over the runs (its "dur", us),
the session's run minimum. Grouped into: stem (the first convolution), blocks, head (the last
1x1 convolution), pool, classifier, other.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scratch import scratch_dir  # noqa: E402

from mnv2b1_ab import compiled  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402


def pgx_profile(model, feeds, threads: int, runs: int, env: dict) -> dict:
    from pygraphx.targets.cpu.profile import time_steps

    prog = compiled(model, threads, env)
    for _ in range(5):
        prog.run(feeds)
    walls, cpus = None, None
    for _ in range(runs):
        w = np.array([s.seconds for s in time_steps(prog._executable, feeds, 1)])
        walls = w if walls is None else np.minimum(walls, w)
        if threads == 1:
            c = np.array(
                [s.seconds for s in time_steps(prog._executable, feeds, 1, time.thread_time)]
            )
            cpus = c if cpus is None else np.minimum(cpus, c)
    whole = []
    for _ in range(runs):
        t0 = time.perf_counter()
        prog.run(feeds)
        whole.append(time.perf_counter() - t0)
    low = prog._executable.lowered
    rows = []
    for k, s in enumerate(low.steps):
        ops = "+".join(i.op.name for i in s.instructions if i.op.name != "@literal")
        rows.append({"step": k, "ops": ops[:70], "wall_us": walls[k] * 1e6,
                     "cpu_us": None if cpus is None else cpus[k] * 1e6})  # fmt: skip
    return {"rows": rows, "run_min_ms": min(whole) * 1e3,
            "run_median_ms": float(np.median(whole)) * 1e3}  # fmt: skip


def ort_profile(model, feeds, threads: int, runs: int) -> dict:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for _ in range(5):
        sess.run(None, feeds)
    whole = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        whole.append(time.perf_counter() - t0)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(scratch_dir(), "ort")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for _ in range(5):
        sess.run(None, feeds)
    for _ in range(runs):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    per: dict[str, list[float]] = {}
    order: list[str] = []
    kinds: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        if name not in per:
            per[name] = []
            order.append(name)
            kinds[name] = e.get("args", {}).get("op_name", "")
        per[name].append(e["dur"])
    rows = [{"node": n, "op": kinds[n], "min_us": float(min(per[n][5:] or per[n]))} for n in order]
    return {"rows": rows, "run_min_ms": min(whole) * 1e3,
            "run_median_ms": float(np.median(whole)) * 1e3}  # fmt: skip


def group_pgx(rows: list[dict]) -> dict:
    out: dict[str, float] = {}
    convs = [r for r in rows if "convolution" in r["ops"]]
    for r in rows:
        key = "other"
        if convs and r is convs[0]:
            key = "stem"
        elif convs and r is convs[-1]:
            key = "head 1x1"
        elif r["ops"].count("convolution") >= 2:
            key = "blocks"
        elif "pooling" in r["ops"]:
            key = "pool"
        elif "dot" in r["ops"]:
            key = "classifier"
        out[key] = out.get(key, 0.0) + r["wall_us"]
    return out


def group_ort(rows: list[dict]) -> dict:
    out: dict[str, float] = {}
    convs = [r for r in rows if "Conv" in r["op"]]
    for r in rows:
        key = "other"
        if convs and r is convs[0]:
            key = "stem"
        elif convs and r is convs[-1]:
            key = "head 1x1"
        elif "Conv" in r["op"]:
            key = "blocks"
        elif "Pool" in r["op"] or "ReduceMean" in r["op"]:
            key = "pool"
        elif r["op"] in ("Gemm", "MatMul"):
            key = "classifier"
        out[key] = out.get(key, 0.0) + r["min_us"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--env", action="append", default=[], help="K=V while compiling")
    p.add_argument("--no-ort", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    env = dict(e.split("=", 1) for e in args.env)
    model = get_model("mobilenetv2", batch=args.batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs("mobilenetv2", model).items()}
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    pg = pgx_profile(model, feeds, args.threads, args.runs, env)
    orr = None if args.no_ort else ort_profile(model, feeds, args.threads, args.runs)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    print(f"batch {args.batch} threads {args.threads} runs {args.runs} env {env}; "
          f"loadavg before {load0} after {load1}")  # fmt: skip
    print("pygraphx steps (min over runs, us):")
    for r in pg["rows"]:
        cpu = "" if r["cpu_us"] is None else f" cpu {r['cpu_us']:8.1f}"
        print(f"  {r['step']:3d} wall {r['wall_us']:8.1f}{cpu}  {r['ops']}")
    ssum = sum(r["wall_us"] for r in pg["rows"])
    print(f"pygraphx: step minimums sum {ssum / 1e3:.3f} ms, run min {pg['run_min_ms']:.3f} ms "
          f"median {pg['run_median_ms']:.3f} (between steps ~{pg['run_min_ms'] - ssum / 1e3:.3f})")
    gp = group_pgx(pg["rows"])
    if orr:
        print("ORT nodes (min over runs, us):")
        for r in orr["rows"]:
            print(f"  {r['min_us']:8.1f}  {r['op']:20s} {r['node']}")
        osum = sum(r["min_us"] for r in orr["rows"])
        print(f"ORT: node minimums sum {osum / 1e3:.3f} ms, run min {orr['run_min_ms']:.3f} "
              f"median {orr['run_median_ms']:.3f}")
        go = group_ort(orr["rows"])
        print("| part | pgx us | ORT us |")
        print("|---|---|---|")
        for k in ["stem", "blocks", "head 1x1", "pool", "classifier", "other"]:
            print(f"| {k} | {gp.get(k, 0):.1f} | {go.get(k, 0):.1f} |")
        print(f"| sum of parts | {ssum:.1f} | {osum:.1f} |")
        print(f"| run (min) | {pg['run_min_ms'] * 1e3:.1f} | {orr['run_min_ms'] * 1e3:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"pgx": pg, "ort": orr, "args": vars(args)},
                                              indent=1, default=str))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
