"""MobileNetV2 bf16: pygraphx's bf16 program step by step against OpenVINO bf16 per layer
(helper mnv16, issue 10).

    python benchmarks/mnv16_bf16_profile.py --threads 1 --batch 1 --runs 60

pygraphx (`quantize_bf16`, its default policy, then the cpu target): `profile.time_steps`,
each step's minimum over `--runs` runs (wall; at 1 thread also thread CPU time); OpenVINO
(`INFERENCE_PRECISION_HINT=bf16`, `PERF_COUNT`): each executed layer's minimum `real_time`
(and `cpu_time`). Grouped: stem (the first convolution), blocks (the other convolutions but
the last), head 1x1 (the last convolution), pool, classifier, other; then the runs' minimum
wall time without per-step timing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cpu_engines import profiled_openvino  # noqa: E402
from mnv2b1_ab import compiled  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402


def pgx(model, feeds, threads: int, runs: int, env: dict) -> dict:
    from pygraphx.targets.cpu.profile import time_steps

    prog = compiled(model, threads, env, bf16=True)
    for _ in range(5):
        prog.run(feeds)
    wall = cpu = None
    for _ in range(runs):
        w = np.array([s.seconds for s in time_steps(prog._executable, feeds, 1)])
        wall = w if wall is None else np.minimum(wall, w)
        if threads == 1:
            c = np.array(
                [s.seconds for s in time_steps(prog._executable, feeds, 1, time.thread_time)]
            )
            cpu = c if cpu is None else np.minimum(cpu, c)
    whole = []
    for _ in range(runs):
        t0 = time.perf_counter()
        prog.run(feeds)
        whole.append(time.perf_counter() - t0)
    groups: dict[str, list[float]] = {}
    steps = prog._executable.lowered.steps
    conv_steps = [k for k, s in enumerate(steps) if any(
        i.op.name == "convolution" for i in s.instructions)]  # fmt: skip
    for k, s in enumerate(steps):
        ops = [i.op.name for i in s.instructions]
        key = "other"
        if k == conv_steps[0]:
            key = "stem"
        elif k == conv_steps[-1] and "pooling" not in ops:
            key = "head 1x1"
        elif "convolution" in ops and "pooling" in ops:
            key = "head 1x1 + pool (+ classifier)"
        elif "convolution" in ops:
            key = "blocks"
        elif "pooling" in ops:
            key = "pool"
        elif "dot" in ops:
            key = "classifier"
        g = groups.setdefault(key, [0.0, 0.0, 0])
        g[0] += wall[k] * 1e6
        g[1] += (cpu[k] * 1e6) if cpu is not None else 0.0
        g[2] += 1
    return {"groups": groups, "run_min_ms": min(whole) * 1e3, "steps": len(steps)}


def openvino(model, feeds, threads: int, runs: int) -> dict:
    compiled_model = profiled_openvino(model, threads, "bf16")
    req = compiled_model.create_infer_request()
    inputs = list(feeds.values())
    real: dict[str, float] = {}
    cpu: dict[str, float] = {}
    kind: dict[str, str] = {}
    order: list[str] = []
    whole = []
    for k in range(runs + 5):
        t0 = time.perf_counter()
        req.infer(inputs)
        whole.append(time.perf_counter() - t0)
        if k < 5:
            continue
        for info in req.get_profiling_info():
            if info.status.name != "EXECUTED":
                continue
            n = info.node_name
            if n not in real:
                order.append(n)
                real[n] = cpu[n] = float("inf")
            real[n] = min(real[n], info.real_time.total_seconds() * 1e6)
            cpu[n] = min(cpu[n], info.cpu_time.total_seconds() * 1e6)
            kind[n] = f"{info.node_type}/{info.exec_type}"
    convs = [n for n in order if kind[n].startswith("Convolution")]
    groups: dict[str, list[float]] = {}
    for n in order:
        t = kind[n]
        key = "other"
        if convs and n == convs[0]:
            key = "stem"
        elif convs and n == convs[-1]:
            key = "head 1x1"
        elif t.startswith("Convolution"):
            key = "blocks"
        elif "Pool" in t or "Reduce" in t:
            key = "pool"
        elif t.startswith(("FullyConnected", "MatMul")):
            key = "classifier"
        g = groups.setdefault(key, [0.0, 0.0, 0])
        g[0] += real[n]
        g[1] += cpu[n]
        g[2] += 1
    return {"groups": groups, "run_min_ms": min(whole[5:]) * 1e3, "layers": len(order),
            "kinds": {n: kind[n] for n in order}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--env", default="", help="K=V,... while compiling pygraphx")
    p.add_argument("--kinds", action="store_true", help="list OpenVINO's layers")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = get_model("mobilenetv2", batch=args.batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs("mobilenetv2", model).items()}
    env = dict(kv.split("=", 1) for kv in args.env.split(",") if kv)
    load = Path("/proc/loadavg").read_text().split()[0]
    ours = pgx(model, feeds, args.threads, args.runs, env)
    theirs = openvino(model, feeds, args.threads, args.runs)
    print(f"mobilenetv2 bf16 batch {args.batch} threads {args.threads} runs {args.runs} "
          f"env {env}; load {load} -> {Path('/proc/loadavg').read_text().split()[0]}")  # fmt: skip
    print(f"{'part':32s} {'pgx wall':>9s} {'pgx cpu':>9s} {'n':>3s} | {'OV real':>9s} "
          f"{'OV cpu':>9s} {'n':>3s}")  # fmt: skip
    for key in sorted(set(ours["groups"]) | set(theirs["groups"])):
        a = ours["groups"].get(key, [0, 0, 0])
        b = theirs["groups"].get(key, [0, 0, 0])
        print(f"{key:32s} {a[0]:9.1f} {a[1]:9.1f} {a[2]:3d} | {b[0]:9.1f} {b[1]:9.1f} {b[2]:3d}")
    sa = [sum(v[i] for v in ours["groups"].values()) for i in (0, 1)]
    sb = [sum(v[i] for v in theirs["groups"].values()) for i in (0, 1)]
    print(f"{'sum':32s} {sa[0]:9.1f} {sa[1]:9.1f} {'':3s} | {sb[0]:9.1f} {sb[1]:9.1f}")
    print(f"run min ms: pgx {ours['run_min_ms']:.3f} ({ours['steps']} steps), "
          f"OV {theirs['run_min_ms']:.3f} ({theirs['layers']} layers)")
    if args.kinds:
        for n, k in theirs["kinds"].items():
            print(" ", n, k)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
