"""Per step kind, 1 thread against 2: how pygraphx's and OpenVINO's work scales over threads.

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/xfmr2_scaling.py --model bert_base

One process; for each thread count a pygraphx program (`CpuTarget(threads=T)`) and an OpenVINO
float32 model (`INFERENCE_NUM_THREADS=T`, one stream, `PERF_COUNT`), the four alternating run by
run. pygraphx runs step by step (each step's wall time and the process CPU time it took);
OpenVINO's per-node `real_time` / `cpu_time`. Plain runs (wall and process CPU) of each engine
alternate with the profiled ones. Printed per step kind (block, ops, output shape): the median
wall ms a run at each count, the speed-up, and at the highest count the CPU time over the wall
time (how many threads were busy); the same for OpenVINO's node kinds; then per block.
Medians: on a shared machine take the least loaded of several runs of this script.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scratch import scratch_dir  # noqa: E402

import cpu_transformer_blocks as ctb  # noqa: E402
import numpy as np  # noqa: E402
from bertb1_profile import ov_block  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402

Samples = dict[str, list[tuple[float, float]]]  # kind -> per run (wall s, cpu s)


def pgx_kind(step: Any) -> str:
    names = [i.op.name for i in step.instructions if i.op.name != "@literal"]
    shape = "x".join(map(str, step.instructions[-1].shape.lens()))
    return f"{ctb.pgx_block(step)}: {','.join(names)[:40]} {shape}"


def pgx_profiled(prog: Any, feeds: dict, out: Samples) -> None:
    """One step-by-step run; each step kind's summed (wall, process CPU) appended to `out`."""
    exe = prog._executable
    kinds = [pgx_kind(s) for s in exe.lowered.steps]
    run: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    clock, cpu = time.perf_counter, time.process_time
    exe.executor.bind(feeds)
    with exe.scope():
        for kind, fn in zip(kinds, exe.executor.steps, strict=True):
            w0, c0 = clock(), cpu()
            fn()
            c1, w1 = cpu(), clock()
            run[kind][0] += w1 - w0
            run[kind][1] += c1 - c0
    exe.executor.collect()
    for k, (w, c) in run.items():
        out[k].append((w, c))


def openvino(model: Any, threads: int, feeds: dict) -> tuple[Any, Any]:
    """OpenVINO float32 on `threads`: (plain run function, profiled run function appending
    each node kind's (real, cpu) seconds to a `Samples`)."""
    import openvino as ov

    path = Path(scratch_dir()) / "model.onnx"
    path.write_bytes(model.SerializeToString())
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
              "NUM_STREAMS": 1}  # fmt: skip
    plain = core.compile_model(core.read_model(str(path)), "CPU", config).create_infer_request()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {**config, "PERF_COUNT": True})
    shapes = ctb.ov_output_shapes(compiled)
    request = compiled.create_infer_request()

    def profiled(out: Samples) -> None:
        request.infer(feeds)
        run: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for info in request.profiling_info:
            shape = shapes.get(info.node_name, [])
            block = ov_block(info.node_type, info.exec_type, shape)
            kind = f"{block}: {info.node_type}/{info.exec_type} {'x'.join(map(str, shape))}"
            run[kind][0] += info.real_time.total_seconds()
            run[kind][1] += info.cpu_time.total_seconds()
        for k, (w, c) in run.items():
            out[k].append((w, c))

    return (lambda: plain.infer(feeds)), profiled


def timed(fn: Any, out: list[tuple[float, float]]) -> None:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    out.append((time.perf_counter() - w0, time.process_time() - c0))


def table(title: str, samples: dict[int, Samples], counts: list[int], top: int) -> None:
    """Median wall ms a run per kind at each count, speed-up, CPU / wall at the last count."""
    hi, lo = counts[-1], counts[0]
    med = {t: {k: np.median(np.array(v), 0) for k, v in samples[t].items()} for t in counts}
    print(f"\n{title}: median ms a run (wall), t{lo}/t{hi} speed-up, busy threads at t{hi}")
    heads = "".join(f"{'t' + str(t):>9s}" for t in counts)
    print(f"  {heads}  cpu t{lo}  speedup  busy  kind")
    blocks: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(len(counts) + 1))
    rows = sorted(med[lo], key=lambda k: -med[lo][k][0])
    for k in rows:
        walls = [med[t].get(k, np.zeros(2))[0] * 1e3 for t in counts]
        blocks[k.split(":")[0]] += [*walls, med[lo][k][1] * 1e3]
        if rows.index(k) < top:
            c = med[hi].get(k, np.zeros(2))
            busy = c[1] / c[0] if c[0] > 0 else 0.0
            speed = walls[0] / walls[-1] if walls[-1] > 0 else 0.0
            cpu = med[lo][k][1] * 1e3
            print("  " + "".join(f"{w:9.2f}" for w in walls) + f"  {cpu:7.2f}  {speed:6.2f}  "
                  f"{busy:4.2f}  {k}")  # fmt: skip
    total = sum(blocks.values())
    for b, row in [*sorted(blocks.items(), key=lambda kv: -kv[1][0]), ("sum", total)]:
        speed = row[0] / row[-2] if row[-2] > 0 else 0.0
        print("  " + "".join(f"{w:9.2f}" for w in row[:-1]) + f"  {row[-1]:7.2f}  {speed:6.2f}"
              f"        [{b}]")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bert_base", choices=["bert_base", "gpt2"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--no-ov", action="store_true")
    args = ap.parse_args(argv)
    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    data = model.SerializeToString()
    args.bf16 = False
    progs, ovs = {}, {}
    for t in args.counts:
        args.threads = t
        progs[t] = ctb.compile_pgx(data, args)
        if not args.no_ov:
            ovs[t] = openvino(model, t, feeds)
    pgx_s: dict[int, Samples] = {t: defaultdict(list) for t in args.counts}
    ov_s: dict[int, Samples] = {t: defaultdict(list) for t in args.counts}
    plain: dict[str, list] = defaultdict(list)
    for r in range(args.runs + 1):
        for t in args.counts:
            timed(partial(progs[t].run, feeds), plain[f"pygraphx t{t}"] if r else [])
            pgx_profiled(progs[t], feeds, pgx_s[t] if r else defaultdict(list))
            if t in ovs:
                timed(ovs[t][0], plain[f"OpenVINO t{t}"] if r else [])
                ovs[t][1](ov_s[t] if r else defaultdict(list))
    print(f"{args.model} b{args.batch} float32, {args.runs} runs; plain runs, median (min) wall ms "
          "and CPU ms:")  # fmt: skip
    for k, v in plain.items():
        a = np.array(v) * 1e3
        print(f"  {k:14s} wall {np.median(a[:, 0]):7.1f} ({a[:, 0].min():7.1f})  cpu "
              f"{np.median(a[:, 1]):7.1f}")  # fmt: skip
    table("pygraphx steps", pgx_s, args.counts, args.top)
    if ovs:
        table("OpenVINO nodes", ov_s, args.counts, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
