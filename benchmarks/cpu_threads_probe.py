"""How the `cpu` target's speed depends on its thread count, on this host.

    python benchmarks/cpu_threads_probe.py                  # 1, 2, 4, 8, 16 threads
    python benchmarks/cpu_threads_probe.py --threads 1 2 --json probe.json

For each built-in model at batch 1 (transformers at sequence 128), at each thread count, with
the per-step thread policy on (small steps on fewer threads, see
`pygraphx/targets/cpu/threads.py`) and off (every step on all threads), and ONNX Runtime at the
same count for reference: the median latency and the mean process CPU time per run (all
threads of the process; CPU time far above latency x threads means threads spin or wait).
Each configuration is compiled once and timed in its own block (warm-up, then runs until
`--seconds` have passed, at least 3 and at most `--max-runs`).

`--churn` instead counts, per model and thread count, the distinct team sizes of the steps and
the OS threads a run starts (GNU OpenMP ends and restarts workers when the team size changes).

`--ab` instead compares the policy on and off (and ORT) at each count in one process, their
blocks alternating for `--rounds` rounds, the order turned by one each round (so a
neighbour's load, or the spinning pool of the engine before, falls on all alike): per
engine the median of its blocks' median latencies (each block runs untimed for `--settle`
seconds first, 0.2 by default: ONNX Runtime's pool spins on for 80-175 ms after its block on
the 16-core host, slowing the next engine's first runs up to 50x, `adapt16_after_ort.py`)
and of their CPU time per run, and in how many rounds the policy-on block was faster than
the policy-off one. `--engines on@16 on@8 ort@16` picks the engines instead (policy on / off or ORT, at a count; `--threads` is then not read),
`--batch 1 8` the batches. Besides the process CPU time (which also counts another engine's pool
still spinning from its block), each block reports its engine's own CPU time per run: the
threads ONNX Runtime started (its pool) are ORT's, every other thread (the caller, GNU OpenMP's
workers) pygraphx's, and the caller's time in an ORT block is ORT's (from
/proc/self/task/*/schedstat, nanoseconds; `benchmarks/cpu_accounting.py`, which
`cpu_vs_peers.py` shares).

`--steps` instead times every step of the fast path (`--runs` runs, median per step) at each
count, with the step's ops, output shape and team size, and ONNX Runtime's own per-node
profile at the same counts, so the layers where the time goes can be set side by side.

`--spincounts 100 1000 10000` repeats the probe once per GNU OpenMP spin count (each in a fresh
process with `GOMP_SPINCOUNT` set, as OpenMP reads it once when torch loads); the rows then carry
their spin count. Without it the probe runs once, with pygraphx's default (or the environment's).

The end of the report names, per model, the thread count with the lowest latency, and the
suggested cap: the smallest count whose latency is within 5% of the model's best on every
model. That is the value for `DEFAULT_CAP` in `threads.py` (or `PGX_CPU_MAX_THREADS` on this
host). The run is meant to stay under 5 minutes on a 16-core host.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: the CPUs this process may use before GNU OpenMP loads (with OMP_PROC_BIND / OMP_PLACES set it
#: binds the loading thread to its first place: `--unpin-caller` gives the caller these back)
CALLER_CPUS = os.sched_getaffinity(0)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_vs_peers import make_ort, make_pygraphx  # noqa: E402

import pygraphx  # noqa: E402, F401  (its spin setting is made before it loads torch)
from benchmarks.cpu_accounting import ThreadLedger  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402

MODELS = ("resnet50", "mobilenetv2", "bert_base", "gpt2")
#: a count is "as good as the best" within this fraction
TOLERANCE = 0.05


def time_block(
    fn: Callable, feeds: dict[str, np.ndarray], warmup: int, seconds: float, max_runs: int
) -> tuple[float, float, int]:
    """(median ms, mean process-CPU ms per run, runs) of one block."""
    for _ in range(warmup):
        fn(feeds)
    walls: list[float] = []
    cpus: list[float] = []
    begin = time.perf_counter()
    while len(walls) < 3 or (time.perf_counter() - begin < seconds and len(walls) < max_runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn(feeds)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - start_cpu)
    return statistics.median(walls) * 1e3, statistics.fmean(cpus) * 1e3, len(walls)


def probe_model(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows of (engine, threads, ms, cpu_ms) for one model."""
    model = get_model(name, batch=args.batch[0], seq_len=args.seq_len)
    feeds = model_inputs(name, model)
    rows = []
    for n in args.threads:
        engines: dict[str, Callable] = {}
        engines["policy_on"] = make_pygraphx(model, args.conv_output, n, True)[0]
        engines["policy_off"] = make_pygraphx(model, args.conv_output, n, False)[0]
        if not args.no_ort:
            engines["ort"] = make_ort(model, n)[0]
        for engine, fn in engines.items():
            ms, cpu_ms, runs = time_block(fn, feeds, args.warmup, args.seconds, args.max_runs)
            row = {"model": name, "engine": engine, "threads": n, "ms": ms, "cpu_ms": cpu_ms,
                   "runs": runs}  # fmt: skip
            rows.append(row)
            print(f"{name:12s} {engine:10s} threads {n:2d}: {ms:9.2f} ms, "
                  f"CPU {cpu_ms:9.2f} ms per run ({runs} runs)", flush=True)  # fmt: skip
        del engines
    return rows


def parse_engines(args: argparse.Namespace, n: int) -> list[tuple[str, str, int]]:
    """(label, kind, threads) of the --ab engines: `--engines` (on@16 ...), else on, off and
    ORT at `n`."""
    specs = args.engines or [f"on@{n}", f"off@{n}"] + ([] if args.no_ort else [f"ort@{n}"])
    out = []
    for spec in specs:
        kind, _, count = spec.partition("@")
        if kind not in ("on", "off", "ort") or not count.isdigit():
            raise SystemExit(f"--engines: {spec!r} is not on@N, off@N or ort@N")
        out.append((spec, kind, int(count)))
    return out


def make_engines(model: Any, feeds: dict[str, np.ndarray], specs: list[tuple[str, str, int]],
                 conv_output: str = "arena"):
    """({label: run}, {label: cpu program}, which threads are whose: ONNX Runtime's sessions
    share the pool "ort", pygraphx runs on the caller's side)."""
    engines: dict[str, Callable] = {}
    progs: dict[str, Any] = {}
    ledger = ThreadLedger()
    for label, kind, n in specs:  # pygraphx first: GNU OpenMP's workers start in its prepare
        if kind != "ort":
            progs[label] = make_pygraphx(model, conv_output, n, kind == "on")[2]
            engines[label] = progs[label].run
            engines[label](feeds)
    for label, kind, n in specs:
        if kind == "ort":
            with ledger.pool(label, "ort"):
                engines[label] = make_ort(model, n)[0]
                engines[label](feeds)
    ledger.seal()
    return engines, progs, ledger


def alternating(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows of (model, batch, engine, median of block ms, of block process-CPU ms and of the
    engine's own CPU ms per run): the engines' blocks alternate, `args.rounds` rounds."""
    rows = []
    for batch in args.batch:
        for name in args.models:
            model = get_model(name, batch=batch, seq_len=args.seq_len)
            feeds = model_inputs(name, model)
            for n in [0] if args.engines else args.threads:
                rows += ab_rows(name, batch, ab_blocks(model, feeds, parse_engines(args, n), args))
    return rows


def ab_blocks(
    model: Any, feeds: dict[str, np.ndarray], specs: list[tuple[str, str, int]], args: Any
) -> dict[str, list[tuple[float, float, float]]]:
    """{engine label: (ms, process CPU ms, own CPU ms) of each of its blocks}."""
    engines, progs, ledger = make_engines(model, feeds, specs, args.conv_output)
    blocks: dict[str, list[tuple[float, float, float]]] = {k: [] for k in engines}
    names = list(engines)
    for r in range(args.rounds):
        # the order turns each round: a block right after ORT's carries the CPU time of
        # ORT's still-spinning pool (16-core host: 1.4-1.8x ORT's against 1.2x)
        for engine in names[r % len(names) :] + names[: r % len(names)]:
            settle = time.perf_counter() + args.settle
            for _ in range(args.warmup):
                engines[engine](feeds)
            while time.perf_counter() < settle:  # (the last engine's pool spinning on)
                engines[engine](feeds)
            before = ledger.start()
            ms, cpu_ms, runs = time_block(engines[engine], feeds, 0, args.seconds, args.max_runs)
            own = ledger.stop(before, engine).per_run(runs).own_ms
            blocks[engine].append((ms, cpu_ms, own))
    used = {p._executable.scope.limit[0] for p in progs.values()}
    load = os.getloadavg()[0]
    print(f"runs took {sorted(used)} threads; load average {load:.1f}; "
          f"{ledger.describe()}")  # fmt: skip
    return blocks


def ab_rows(name: str, batch: int, blocks: dict[str, list]) -> list[dict[str, Any]]:
    """The --ab rows of one model, printed; rounds won by policy on against off at a count."""
    rows = []
    for engine, got in blocks.items():
        kind, _, count = engine.partition("@")
        ms, cpu_ms, own = (statistics.median(b[k] for b in got) for k in range(3))
        engine_name = {"on": "policy_on", "off": "policy_off"}.get(kind, kind)
        row = {"model": name, "batch": batch, "engine": engine_name,
               "label": engine, "threads": int(count), "ms": ms, "cpu_ms": cpu_ms,
               "own_cpu_ms": own, "blocks": got}  # fmt: skip
        if kind == "on" and f"off@{count}" in blocks:
            pairs = zip(got, blocks[f"off@{count}"], strict=True)
            row["on_faster_rounds"] = sum(a[0] < b[0] for a, b in pairs)
        if kind == "on" and f"ort@{count}" in blocks:
            row["over_ort"] = over_ort(got, blocks[f"ort@{count}"])
        rows.append(row)
        print(f"{name:12s} b{batch} {engine:9s}: {ms:9.2f} ms, CPU {cpu_ms:9.2f} ms per run, "
              f"own {own:9.2f} (median of {len(got)} blocks)", flush=True)  # fmt: skip
        if "over_ort" in row:
            r = row["over_ort"]
            print(f"{name:12s} b{batch} {engine:9s} / ORT: latency {r['ms']:.2f}x, "
                  f"process CPU {r['cpu_ms']:.2f}x, own CPU {r['own_cpu_ms']:.2f}x "
                  f"(medians over rounds of the two blocks' ratio)")  # fmt: skip
    return rows


def over_ort(mine: list[tuple[float, ...]], ort: list[tuple[float, ...]]) -> dict[str, float]:
    """Median over rounds of (block of `mine`) / (ORT's block of the same round): latency,
    process CPU and own CPU per run (a round's two blocks share the host's drift)."""
    keys = ("ms", "cpu_ms", "own_cpu_ms")
    return {
        key: statistics.median(a[k] / b[k] for a, b in zip(mine, ort, strict=True))
        for k, key in enumerate(keys)
    }


def step_label(instructions: Any) -> str:
    """Ops of a step and its result's shape (a convolution adds its weight's shape)."""
    last = instructions[-1]
    ops = "+".join(i.op.name for i in instructions)
    extra = ""
    if last.op.name == "convolution" or instructions[0].op.name == "convolution":
        conv = instructions[0]
        extra = f" w{conv.inputs[1].shape.lens()}"
    return f"{ops} {last.shape.lens()}{extra}"


def step_times(prog: Any, feeds: dict[str, np.ndarray], runs: int) -> tuple[list[float], float]:
    """(median us of each fast-path step, median ms of a whole untimed run) of a `cpu`
    program."""
    exe = prog._executable
    steps = exe.executor.steps
    clock = time.perf_counter
    for _ in range(3):
        prog.run(feeds)
    per: list[list[float]] = [[] for _ in steps]
    for _ in range(runs):
        exe.executor.bind(feeds)
        with exe.scope():
            for k, fn in enumerate(steps):
                start = clock()
                fn()
                per[k].append(clock() - start)
    whole = []
    for _ in range(runs):
        start = clock()
        prog.run(feeds)
        whole.append(clock() - start)
    return [statistics.median(p) * 1e6 for p in per], statistics.median(whole) * 1e3


def ort_profile(model: Any, feeds: dict[str, np.ndarray], n: int, runs: int) -> dict[str, Any]:
    """ONNX Runtime's per-node median us (in the order the nodes ran) and its median run ms."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = n
    opts.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        opts.profile_file_prefix = str(Path(tmp) / "ort")
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])  # fmt: skip
        whole = []
        for _ in range(runs + 3):
            start = time.perf_counter()
            sess.run(None, feeds)
            whole.append(time.perf_counter() - start)
        events = json.loads(Path(sess.end_profiling()).read_text())
    nodes: dict[str, list[float]] = {}
    ops: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            nodes.setdefault(name, []).append(float(e["dur"]))
            ops[name] = e.get("args", {}).get("op_name", "")
    rows = [
        {"node": k, "op": ops[k], "us": statistics.median(v[3:] or v)} for k, v in nodes.items()
    ]
    return {"nodes": rows, "ms": statistics.median(whole[3:]) * 1e3}


def _programs(args: argparse.Namespace):
    """(model name, threads, model, inputs, its `cpu` program) for each of `args.models` at
    each of `args.threads` (batch 1, policy on)."""
    for name in args.models:
        model = get_model(name, batch=args.batch[0], seq_len=args.seq_len)
        feeds = model_inputs(name, model)
        for n in args.threads:
            yield name, n, model, feeds, make_pygraphx(model, args.conv_output, n, True)[2]


def steps_probe(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per model and count: the fast path's step times and ORT's node times."""
    rows = []
    for name, n, model, feeds, prog in _programs(args):
        exe = prog._executable
        us, whole = step_times(prog, feeds, args.runs)
        labels = [step_label(c) for c in exe.executor.computes]
        steps = [{"step": lab, "threads": t, "us": u}
                 for lab, t, u in zip(labels, exe.chained.counts, us, strict=True)]  # fmt: skip
        ort_rows = {} if args.no_ort else ort_profile(model, feeds, n, args.runs)
        rows.append({"model": name, "threads": n, "run_ms": whole, "steps_us": sum(us),
                     "steps": steps, "ort": ort_rows})  # fmt: skip
        print(
            f"## {name} threads {n}: run {whole:.3f} ms, steps sum {sum(us) / 1e3:.3f} ms; "
            f"ORT run {ort_rows.get('ms', 0):.3f} ms, nodes sum "
            f"{sum(r['us'] for r in ort_rows.get('nodes', [])) / 1e3:.3f} ms",
            flush=True,
        )
        for s in steps:
            print(f"  {s['us']:8.1f} us  t{s['threads']:<2d} {s['step']}")
        for r in ort_rows.get("nodes", []):
            print(f"  ort {r['us']:8.1f} us  {r['op']:14s} {r['node']}")
        del prog
    return rows


def threads_started(prog: Any, feeds: dict[str, np.ndarray], runs: int = 3) -> float:
    """OS threads started per run of a compiled `cpu` program: the threads alive after each step
    of a run (the fast path's steps in its scope, as `run` makes them) that were not alive
    before. GNU OpenMP ends surplus workers when a region's team is smaller than the last one
    and starts them again for a larger one, so this counts team-size churn."""
    exe = prog._executable
    prog.run(feeds)
    seen = set(os.listdir("/proc/self/task"))
    started = 0
    for _ in range(runs):
        exe.executor.bind(feeds)
        with exe.scope():
            for fn in exe.executor.steps:
                fn()
                now = set(os.listdir("/proc/self/task"))
                started += len(now - seen)
                seen |= now
    return started / runs


def churn(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows of (model, threads, distinct team sizes, threads started per run), policy on."""
    rows = []
    for name, n, _model, feeds, prog in _programs(args):
        counts = prog._executable.step_threads
        switches = sum(1 for a, b in zip(counts, counts[1:], strict=False) if a != b)
        started = threads_started(prog, feeds)
        row = {"model": name, "threads": n, "team_sizes": sorted(set(counts)),
               "switches": switches, "started_per_run": started}  # fmt: skip
        rows.append(row)
        print(f"{name:12s} threads {n:2d}: {len(counts)} steps, team sizes "
              f"{row['team_sizes']}, {switches} switches, "
              f"{started:.1f} OS threads started per run", flush=True)  # fmt: skip
    return rows


def suggest(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Best (engine, count) per model (policy on, any spin count) and the smallest count within
    TOLERANCE of every model's best."""
    best: dict[str, str] = {}
    ok_counts: set[int] | None = None
    totals: dict[int, float] = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = {
            (r["engine"], r["threads"]): r["ms"]
            for r in rows
            if r["model"] == name and r["engine"].startswith("policy_on")
        }
        top = min(mine.values())
        engine, n = min(mine, key=mine.__getitem__)
        best[name] = f"{n} threads ({engine})"
        good = {n for (_, n), ms in mine.items() if ms <= top * (1 + TOLERANCE)}
        ok_counts = good if ok_counts is None else ok_counts & good
        for (_, n), ms in mine.items():
            totals[n] = totals.get(n, 0.0) + ms
    # no count good for every model: the one with the lowest sum of latencies
    cap = min(ok_counts) if ok_counts else min(totals, key=totals.__getitem__)
    return {"best_threads": best, "suggested_cap": cap}


def print_table(rows: list[dict[str, Any]], threads: list[int]) -> None:
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    print("\n| model | engine | " + " | ".join(f"{n} thr ms (CPU ms)" for n in threads) + " |")
    print("|---|---|" + "---|" * len(threads))
    for name in dict.fromkeys(r["model"] for r in rows):
        for engine in engines:
            cells = []
            for n in threads:
                hit = [
                    r for r in rows if (r["model"], r["engine"], r["threads"]) == (name, engine, n)
                ]
                cells.append(f"{hit[0]['ms']:.2f} ({hit[0]['cpu_ms']:.1f})" if hit else "-")
            print(f"| {name} | {engine} | " + " | ".join(cells) + " |")


def with_spincounts(argv: list[str], spincounts: list[int]) -> list[dict[str, Any]]:
    """Rows of this probe run once per spin count, each in its own process."""
    import os

    rest = list(argv)
    k = rest.index("--spincounts")
    del rest[k : k + 1 + len(spincounts)]
    rows: list[dict[str, Any]] = []
    for spin in spincounts:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.json"
            env = {**os.environ, "GOMP_SPINCOUNT": str(spin)}
            env.pop("OMP_WAIT_POLICY", None)
            cmd = [sys.executable, __file__, *rest, "--json", str(out)]
            subprocess.run(cmd, env=env, check=True)
            for row in json.loads(out.read_text())["rows"]:
                rows.append({**row, "engine": f"{row['engine']}@spin{spin}", "spincount": spin})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=1.0, help="time per block (default 1)")
    ap.add_argument("--max-runs", type=int, default=30)
    ap.add_argument("--settle", type=float, default=0.2,
                    help="--ab: seconds each block runs untimed first (default 0.2: the engine "
                    "before keeps its pool spinning for 80-175 ms on the 16-core host)")
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--spincounts", nargs="+", type=int, default=None, help="GOMP_SPINCOUNTs")
    ap.add_argument("--churn", action="store_true", help="count OS threads started per run")
    ap.add_argument("--steps", action="store_true", help="time every step, and ORT's nodes")
    ap.add_argument("--runs", type=int, default=30, help="runs per count with --steps")
    ap.add_argument("--ab", action="store_true", help="alternate policy on / off blocks")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of blocks with --ab")
    ap.add_argument("--engines", nargs="+", default=None, help="--ab engines: on@16 ort@16 ...")
    ap.add_argument("--batch", nargs="+", type=int, default=[1], help="batches (several: --ab)")
    ap.add_argument("--unpin-caller", action="store_true", help="undo OMP_PROC_BIND's caller pin")
    ap.add_argument("--conv-output", choices=("arena", "torch"), default="arena",
                    help="the cpu target's conv_output (default: the target's own default, arena; "
                    "the 16-core tables before session 15 used torch)")
    ap.add_argument("--json", type=Path, default=None)
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    if len(args.batch) > 1 and not args.ab:
        ap.error("several --batch values need --ab")
    start = time.perf_counter()
    if args.churn or args.steps:
        rows = churn(args) if args.churn else steps_probe(args)
        if args.json is not None:
            args.json.write_text(json.dumps({"churn" if args.churn else "steps": rows}, indent=2))
        return 0
    if args.spincounts:
        rows = with_spincounts([a for a in argv if a != "--json" and a != str(args.json)],
                               args.spincounts)  # fmt: skip
        return report(rows, args, start)
    import torch

    if args.unpin_caller:
        os.sched_setaffinity(0, CALLER_CPUS)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible, "
          f"affinity {len(os.sched_getaffinity(0))}; torch {torch.__version__}; "
          f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'unset')}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")  # fmt: skip
    rows: list[dict[str, Any]] = []
    if args.ab:
        rows = alternating(args)
    else:
        for name in args.models:
            rows += probe_model(name, args)
    return report(rows, args, start)


def report(rows: list[dict[str, Any]], args: argparse.Namespace, start: float) -> int:
    """The table, the advice (from the first batch's rows), and the JSON file."""
    first = [r for r in rows if r.get("batch", args.batch[0]) == args.batch[0]]
    print_table(first, args.threads)
    advice = suggest(first)
    elapsed = time.perf_counter() - start
    print(f"\nbest thread count per model (policy on): {advice['best_threads']}")
    print(f"suggested cap (DEFAULT_CAP in pygraphx/targets/cpu/threads.py, or PGX_CPU_MAX_"
          f"THREADS): {advice['suggested_cap']}; probe took {elapsed:.0f} s")  # fmt: skip
    if args.json is not None:
        doc = {"threads": args.threads, "rows": rows, **advice, "seconds": elapsed}
        args.json.write_text(json.dumps(doc, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
