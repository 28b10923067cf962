"""pygraphx `cpu` vs ONNX Runtime (CPU EP), OpenVINO and torch eager, on the built-in models.

    python benchmarks/cpu_vs_peers.py                   # resnet50, mobilenetv2, bert_base, gpt2
    python benchmarks/cpu_vs_peers.py --threads 1       # every engine on 1 thread
    python benchmarks/cpu_vs_peers.py --quick           # fewer runs, batch 1 only
    python benchmarks/cpu_vs_peers.py --neighbour       # engines alternate run by run
    python benchmarks/cpu_vs_peers.py --neighbour --ort-spin between_runs
                                                        # ORT's pool stops spinning after a run
    python benchmarks/cpu_vs_peers.py --json out.json --profile
    python benchmarks/cpu_vs_peers.py --models vit_b16 unet_small yolov8_style minilm
                                                        # zoo models (benchmarks/zoo.py), once
                                                        # each at the zoo's own batch

Every engine runs the same ONNX model (`pygraphx.models`, random weights) on the same inputs
with the same thread count (`--threads N`, default: the `cpu` target's, i.e. `PGX_CPU_THREADS`
or the physical cores this process may use, capped; see `pygraphx/targets/cpu/threads.py`):
pygraphx through `get_target("cpu", threads=N)`, ONNX Runtime through `intra_op_num_threads`
(other session options default), OpenVINO through `INFERENCE_NUM_THREADS` with the LATENCY
hint, torch eager through `torch.set_num_threads`. OpenVINO runs when `openvino` is importable,
twice: at fp32 (`INFERENCE_PRECISION_HINT=f32`, the fair comparison) and with its default
precision on this CPU (bf16 where the processor has bf16 instructions; its max |diff| vs ORT
shows what that costs). pygraphx also runs at bf16 (`pgx_bf16`: `quantize_bf16` before compile,
what the driver's `--bf16` does) where oneDNN has bf16 instructions on this processor
(`--no-bf16` leaves it out; by default `quantize_bf16`'s own policy, "products": the products
and what computes only on their results in bf16, softmax, norms and residual sums in float32;
`--bf16-ops all` converts everything, `--bf16-ops dot` only the matrix products, as the
driver's `--precision-ops`). Every engine's relative RMS error against ORT's float32 outputs,
||y - y_ort|| / ||y_ort|| (the worst output), is reported next to its max |diff|: it is the error
bf16 costs for `pgx_bf16` and `ov_default`. torch eager runs the CNNs only: a direct
interpretation of the ONNX graph with `torch.nn.functional` calls in NCHW (what an eager
`nn.Module` does).

Timing: each engine is timed in its own block of runs (warm-up, then `--repeat` timed runs),
the engines one after another, and the whole round twice (the second in reverse order); an
engine's figure is the median of its better block. This is how a process that runs one
model sees it. `--neighbour` instead alternates single runs of the engines (pygraphx, ORT,
OpenVINO, ...), so every run follows another engine's: thread pools that spin after their
work (ORT's, OpenVINO's) then stall the next engine's threads, which is what a program with
busy neighbours meets. Both modes report
wall time, and CPU time per run (warm-up runs excluded) two ways: the process CPU time (all
threads of the process, "cpu_ms", the per-row lines and the JSON), which also counts another
engine's pool still spinning from its runs, and each engine's own CPU time ("own_cpu_ms", the
table; `benchmarks/cpu_accounting.py`: per-thread counters, ORT's and OpenVINO's pools are
theirs, with the calling thread during their runs, every other thread is the caller-side
engine's: pygraphx, eager), with the other engines' threads' CPU in its runs ("others_cpu_ms")
and the median over rounds of its own CPU over ORT's in the same round ("own_cpu_over_ort",
the table's "pgx/ORT own CPU": issue 10's bound is 1.5). CPU time far above wall time x
threads' useful work means threads spin.
"Compile" is the time from ONNX bytes to a runnable model: parse + passes + prepare for
pygraphx, session creation for ORT, read + compile for OpenVINO. With `--profile`, the models
where pygraphx is slower than ORT get a per-op breakdown from a profiled run
(`program.run(params, observer=...)`, which reports every IR instruction and so runs fused
producers as separate steps) and from timing the fast path's own steps (where a convolution
with its fused epilogue is one step). The script also measures the executor's
per-instruction overhead on a chain of 200 small instructions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from benchmarks.cpu_accounting import ThreadLedger, Window, timed_block  # noqa: E402
from benchmarks.cpu_engines import (  # noqa: E402
    ORT_SPIN,
    make_eager,
    make_openvino,
    make_ort,
    make_pygraphx,
    openvino_available,
)
from benchmarks.zoo import SIZES, ZOO_NAMES, input_summary, zoo_model  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402

CNNS = ("resnet50", "mobilenetv2")
MODELS = ("resnet50", "mobilenetv2", "bert_base", "gpt2")


# --- measurement ----------------------------------------------------------------------------


def _timed(fn: Callable, feeds: dict[str, np.ndarray]) -> tuple[float, float]:
    start, start_cpu = time.perf_counter(), time.process_time()
    fn(feeds)
    return time.perf_counter() - start, time.process_time() - start_cpu


#: one engine's sample in one round: (wall ms, process-CPU ms, its CPU ms split) per run
Sample = tuple[float, float, Window]
Engines = dict[str, Callable]
Feeds = dict[str, np.ndarray]
#: "ms", "cpu_ms", "own_cpu_ms", ... -> engine -> figure (`blockwise`, `neighbours`)
Figures = dict[str, dict[str, float]]


def blockwise(
    engines: Engines, feeds: Feeds, warmup: int, repeat: int, ledger: ThreadLedger
) -> Figures:
    """Each engine timed in its own block of runs, two rounds, the better block (by median
    latency) kept: its median wall-clock ms ("ms"), mean process-CPU ms per run ("cpu_ms"), and
    the engine's own CPU ms per run and the other engines' threads' ("own_cpu_ms",
    "others_cpu_ms", `cpu_accounting`; warm-up runs excluded); "own_cpu_over_ort" is the
    median over rounds of (own CPU of the engine's block) / (ORT's in the same round). The
    second round runs the blocks in the reverse order, so that no engine has both its blocks
    right after the same neighbour: a block just after ONNX Runtime's runs 2-3x slower for its
    first ~50 ms on 2 cores (MobileNetV2 bf16, measured: ORT's pool still holds the cores),
    which, with the first order, fell on pgx bf16 in both rounds; and the process CPU of such
    a block carries ORT's pool still spinning (the own CPU does not)."""
    rounds: list[dict[str, Sample]] = []
    for order in (list(engines.items()), list(engines.items())[::-1]):
        got: dict[str, Sample] = {}
        for name, fn in order:
            for _ in range(warmup):
                fn(feeds)
            walls, cpus, window = timed_block(ledger, name, lambda fn=fn: fn(feeds), repeat)
            got[name] = (statistics.median(walls) * 1e3, statistics.fmean(cpus) * 1e3, window)
        rounds.append(got)
    best = {k: min((r[k] for r in rounds), key=lambda s: s[0]) for k in engines}
    return _summary(best, rounds)


def neighbours(
    engines: Engines, feeds: Feeds, warmup: int, repeat: int, ledger: ThreadLedger
) -> Figures:
    """The engines alternating single runs (each run right after another engine's), `repeat`
    rounds: the median wall-clock ms, the mean process-CPU, own and others' CPU ms per run, and
    the median over rounds of each engine's own CPU over ORT's (as `blockwise`). The per-run
    snapshots of the threads' counters are taken outside the timed runs."""
    for fn in engines.values():
        for _ in range(warmup):
            fn(feeds)
    rounds: list[dict[str, Sample]] = []
    for _ in range(repeat):
        got: dict[str, Sample] = {}
        for name, fn in engines.items():
            before = ledger.start()
            wall, cpu = _timed(fn, feeds)
            got[name] = (wall * 1e3, cpu * 1e3, ledger.stop(before, name))
        rounds.append(got)
    typical = {
        k: (
            statistics.median(r[k][0] for r in rounds),
            statistics.fmean(r[k][1] for r in rounds),
            Window(
                statistics.fmean(r[k][2].own_ms for r in rounds),
                statistics.fmean(r[k][2].others_ms for r in rounds),
            ),
        )
        for k in engines
    }
    return _summary(typical, rounds)


def _summary(kept: dict[str, Sample], rounds: list[dict[str, Sample]]) -> Figures:
    """The figures of `blockwise` / `neighbours` from each engine's kept sample and the rounds
    (the own-CPU ratio to ORT per round, its median)."""
    over_ort = {
        k: statistics.median(r[k][2].own_ms / max(r["ort"][2].own_ms, 1e-9) for r in rounds)
        for k in kept
    }
    return {
        "ms": {k: s[0] for k, s in kept.items()},
        "cpu_ms": {k: s[1] for k, s in kept.items()},
        "own_cpu_ms": {k: s[2].own_ms for k, s in kept.items()},
        "others_cpu_ms": {k: s[2].others_ms for k, s in kept.items()},
        "own_cpu_over_ort": over_ort,
    }


def profile(prog: Any, feeds: dict[str, np.ndarray], runs: int = 3) -> list[tuple[str, float, int]]:
    """(op kind, mean ms per run, count) from profiled runs, largest first."""
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for r in range(runs):

        def observe(ins: Any, value: Any, seconds: float, r: int = r) -> None:
            key = ins.op.name
            if ins.module_inputs:
                body = [i.op.name for i in ins.module_inputs[0].instructions
                        if not i.is_param() and not i.is_return()]  # fmt: skip
                key += "{" + ",".join(body) + "}"
            total[key] += seconds / runs
            if r == 0:
                count[key] += 1

        prog.run(feeds, observer=observe)
    rows = [(k, v * 1e3, count[k]) for k, v in total.items()]
    return sorted(rows, key=lambda r: -r[1])


def step_profile(prog: Any, feeds: dict[str, np.ndarray], runs: int = 3) -> list[tuple]:
    """(step kind, mean ms per run, count) of the fast path's own steps, largest first: fused
    steps (a convolution with its epilogue, a GEMM with its bias and GELU) show as one."""
    import torch

    exe = prog._executable
    steps = exe.lowered.steps
    times = np.zeros(len(steps))
    for _ in range(runs):
        exe.executor.bind(feeds)
        with torch.inference_mode():
            for k, step in enumerate(steps):
                start = time.perf_counter()
                step.fn()
                times[k] += time.perf_counter() - start
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for k, step in enumerate(steps):
        key = "+".join(_kind(ins) for ins in step.instructions)
        total[key] += times[k] / runs
        count[key] += 1
    return sorted(((k, v * 1e3, count[k]) for k, v in total.items()), key=lambda r: -r[1])


def _kind(ins: Any) -> str:
    if not ins.module_inputs:
        return ins.op.name
    body = [i.op.name for i in ins.module_inputs[0].instructions
            if not i.is_param() and not i.is_return()]  # fmt: skip
    return ins.op.name + "{" + ",".join(body) + "}"


def per_instruction_overhead(n: int = 200) -> dict[str, float]:
    """Microseconds per instruction for a chain of `n` tiny element-wise instructions (2x2
    floats, so the figure is the runtime's overhead plus torch's dispatch), and for the bare
    executor loop over `n` no-op steps."""
    import torch

    from pygraphx.ir.program import Program
    from pygraphx.ir.shape import Shape
    from pygraphx.runtime.executor import Executor

    prog = Program()
    main = prog.get_main_module()
    y = main.add_parameter("x", Shape("float_type", [2, 2]))
    for k in range(n):
        y = main.add_instruction(pygraphx.make_op(("relu", "neg", "abs", "exp")[k % 4]), [y])
    main.add_return([y])
    exe = pygraphx.get_target("cpu").prepare(prog, {})
    feeds = {"x": np.ones((2, 2), np.float32)}
    for _ in range(20):
        exe.run(feeds)
    ts = []
    for _ in range(300):
        start = time.perf_counter()
        exe.run(feeds)
        ts.append(time.perf_counter() - start)
    bare = Executor([lambda: None] * n, lambda p: None, lambda: [], context=torch.inference_mode)
    tb = []
    for _ in range(300):
        start = time.perf_counter()
        bare.run({})
        tb.append(time.perf_counter() - start)
    out = torch.empty(2, 2)
    x = torch.ones(2, 2)
    with torch.inference_mode():
        start = time.perf_counter()
        for _ in range(n * 50):
            torch.neg(x, out=out)
        raw = (time.perf_counter() - start) / (n * 50)
    return {
        "us_per_instruction": statistics.median(ts) / n * 1e6,
        "us_per_step_executor_loop": statistics.median(tb) / n * 1e6,
        "us_per_raw_torch_call": raw * 1e6,
    }


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS + ZOO_NAMES)
    ap.add_argument("--zoo-size", choices=("full", "test"), default="full", help="zoo models")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None, help="default: the cpu target's count")
    ap.add_argument("--quick", action="store_true", help="1 warm-up, 3 timed runs, batch 1")
    ap.add_argument("--neighbour", action="store_true", help="alternate single runs of engines")
    ap.add_argument(
        "--ort-spin",
        choices=tuple(ORT_SPIN),
        default="default",
        help="ORT's pool after its work: spins (default), never (off), stops at a run's end "
        "(between_runs: a neighbour that leaves the cores free; see cpu_neighbour_probe.py)",
    )
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--no-openvino", action="store_true")
    ap.add_argument("--no-bf16", action="store_true", help="no pygraphx bf16 (pgx_bf16) engine")
    ap.add_argument(
        "--bf16-ops",
        nargs="+",
        default=["products"],
        help="pgx_bf16's converted operators (driver: --precision-ops), e.g. dot or all; "
        "default quantize_bf16's own, products",
    )
    ap.add_argument("--no-step-threads", action="store_true", help="pygraphx: N on every step")
    ap.add_argument("--profile", action="store_true", help="per-op breakdown where we lose")
    ap.add_argument("--conv-output", choices=("torch", "arena"), default="arena")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.warmup, args.repeat, args.batches = 1, 3, [1]
    return args


def make_engines(
    model: onnx.ModelProto,
    name: str,
    feeds: dict[str, np.ndarray],
    args: argparse.Namespace,
    threads: int,
) -> tuple[dict[str, Callable], dict[str, float], dict[str, str], Any, ThreadLedger]:
    """name -> run, name -> compile seconds, notes (OpenVINO's precisions), pygraphx's program,
    and which threads are whose (`cpu_accounting`): each engine runs once as it is made, the
    caller-side ones (pygraphx, eager: GNU OpenMP's workers) first, ORT's and OpenVINO's
    creation and first run each in their pool's window."""
    ledger = ThreadLedger()
    run_pgx, t_pgx, prog = make_pygraphx(model, args.conv_output, threads, not args.no_step_threads)
    engines: dict[str, Callable] = {"pygraphx": run_pgx}
    compile_s = {"pygraphx": t_pgx}
    notes: dict[str, str] = {}
    if not args.no_bf16 and bf16_native():
        engines["pgx_bf16"], compile_s["pgx_bf16"], _ = make_pygraphx(
            model, args.conv_output, threads, not args.no_step_threads, bf16=tuple(args.bf16_ops)
        )
    if name in CNNS and not args.no_eager:
        engines["eager"], compile_s["eager"] = make_eager(model)
    for fn in engines.values():
        fn(feeds)
    with ledger.pool("ort", "ort"):
        engines["ort"], compile_s["ort"] = make_ort(model, threads, args.ort_spin)
        engines["ort"](feeds)
    if not args.no_openvino and openvino_available():
        for key, precision in (("ov_f32", "f32"), ("ov_default", None)):
            with ledger.pool(key, "openvino"):
                engines[key], compile_s[key], notes[key] = make_openvino(model, threads, precision)
                engines[key](feeds)
    ledger.seal()
    order = ("pygraphx", "ort", "pgx_bf16", "ov_f32", "ov_default", "eager")
    return {k: engines[k] for k in order if k in engines}, compile_s, notes, prog, ledger


def bf16_native() -> bool:
    """oneDNN runs bf16 natively on this processor (else `pgx_bf16` is left out)."""
    from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16

    return cpu_has_bf16()


def relative_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The worst output's relative RMS error ||got - want|| / ||want||."""
    errors = []
    for a, b in zip(got, want, strict=True):
        ref = np.asarray(b, dtype=np.float64)
        diff = np.asarray(a, dtype=np.float64) - ref
        errors.append(float(np.linalg.norm(diff) / max(np.linalg.norm(ref), 1e-30)))
    return max(errors)


def load_zoo(name: str, size: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], int]:
    """A zoo model (exported once, cached), its inputs and its batch."""
    path, feeds = zoo_model(name, size)
    print(f"# {name} ({SIZES[name][size]}): {input_summary(feeds)}", flush=True)
    return onnx.load(str(path)), feeds, int(next(iter(feeds.values())).shape[0])


def measure(name: str, batch: int, args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """One table row: every engine on one model and batch."""
    seq = args.seq_len if name not in CNNS else 0
    if name in ZOO_NAMES:
        model, feeds, batch = load_zoo(name, args.zoo_size)
        seq = 0
    else:
        model = get_model(name, batch=batch, seq_len=max(seq, 1))
        feeds = model_inputs(name, model)
    engines, compile_s, notes, prog, ledger = make_engines(model, name, feeds, args, threads)
    reference = engines["ort"](feeds)
    diffs, rel = {}, {}
    for key, fn in engines.items():
        got = [np.asarray(a, dtype=np.float64) for a in fn(feeds)]
        diffs[key] = max(float(np.max(np.abs(a - b))) for a, b in zip(got, reference, strict=True))
        rel[key] = relative_error(got, reference)
    timing = neighbours if args.neighbour else blockwise
    figures = timing(engines, feeds, args.warmup, args.repeat, ledger)
    ms = figures["ms"]
    row: dict[str, Any] = {
        "model": name,
        "batch": batch,
        "seq_len": seq or None,
        **figures,
        "threads_by_pool": ledger.describe(),
        "compile_s": compile_s,
        "ratio_pygraphx_over_ort": ms["pygraphx"] / ms["ort"],
        "max_abs_diff_vs_ort": diffs,
        "rel_rms_error_vs_ort_fp32": rel,
        "openvino_precision": notes,
        "fallback_ops": prog._executable.fallbacks,
    }
    if args.profile and ms["pygraphx"] > ms["ort"]:
        row["profile"] = [{"op": k, "ms": v, "count": c} for k, v, c in profile(prog, feeds)[:8]]
        row["steps"] = [{"op": k, "ms": v, "count": c} for k, v, c in step_profile(prog, feeds)[:8]]
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from pygraphx.targets.cpu.threads import resolve_threads

    resolved = resolve_threads(args.threads)
    threads = resolved.n
    torch.set_num_threads(threads)  # torch eager's count (pygraphx sets its own per run)
    ov = __import__("openvino").__version__ if openvino_available() else "not installed"
    mode = "neighbour (alternating single runs)" if args.neighbour else "blocks (best of 2)"
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible; "
        f"Threads: {resolved}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
        f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'unset')}; torch {torch.__version__}, "
        f"onnxruntime {__import__('onnxruntime').__version__} (pool spin: {args.ort_spin}), "
        f"openvino {ov}; timing: {mode}, "
        f"warm-up {args.warmup}, timed {args.repeat}"
    )
    results = []
    for name in args.models:
        for batch in args.batches if name not in ZOO_NAMES else args.batches[:1]:
            row = measure(name, batch, args, threads)
            results.append(row)
            _print_row(row)
    overhead = per_instruction_overhead()
    print(
        f"\nper-instruction overhead (200 tiny instructions): {overhead['us_per_instruction']:.2f} "
        f"us/instruction (bare executor loop {overhead['us_per_step_executor_loop']:.3f} us/step, "
        f"one raw torch call {overhead['us_per_raw_torch_call']:.2f} us)"
    )
    _print_table(results, threads)
    if args.json is not None:
        doc = {
            "threads": threads,
            "threads_source": str(resolved),
            "mode": "neighbour" if args.neighbour else "blocks",
            "ort_spin": args.ort_spin,
            "step_threads": not args.no_step_threads,
            "bf16_ops": args.bf16_ops,
            "results": results,
            "overhead": overhead,
        }
        args.json.write_text(json.dumps(doc, indent=2))
        print(f"wrote {args.json}")
    return 0


def _print_row(row: dict[str, Any]) -> None:
    parts = ", ".join(f"{k} {v:.2f} ms" for k, v in row["ms"].items())
    ratio = row["ratio_pygraphx_over_ort"]
    diff = ", ".join(f"{k} {v:.1e}" for k, v in row["max_abs_diff_vs_ort"].items() if k != "ort")
    rel = ", ".join(
        f"{k} {v:.1e}" for k, v in row["rel_rms_error_vs_ort_fp32"].items() if k != "ort"
    )
    cpu = ", ".join(f"{k} {v:.2f}" for k, v in row["cpu_ms"].items())
    own = ", ".join(
        f"{k} {v:.2f} ({row['own_cpu_over_ort'][k]:.2f}x ORT's; others' threads "
        f"{row['others_cpu_ms'][k]:.2f})"
        for k, v in row["own_cpu_ms"].items()
    )
    ov = "".join(f"; {k} runs at {v}" for k, v in row["openvino_precision"].items())
    print(f"{row['model']} b{row['batch']}: {parts}; pygraphx/ort {ratio:.2f}; "
          f"max |diff| vs ort: {diff}; relative RMS error vs ort fp32: {rel}; "
          f"process CPU ms per run: {cpu}; own CPU ms per run: {own}{ov}; "
          f"threads: {row['threads_by_pool']}", flush=True)  # fmt: skip
    if "profile" in row:
        print("  profiled run (observer; every IR instruction, fused producers run apart):")
        for p in row["profile"]:
            print(f"    {p['ms']:8.3f} ms  x{p['count']:<3d} {p['op'][:90]}")
        print("  fast-path steps (as they run; a fused step shows as producer+user):")
        for p in row["steps"]:
            print(f"    {p['ms']:8.3f} ms  x{p['count']:<3d} {p['op'][:90]}")


_ENGINES = (("pygraphx", "pygraphx"), ("pgx_bf16", "pgx bf16"), ("ort", "ORT"),
            ("ov_f32", "OV f32"), ("ov_default", "OV default"), ("eager", "eager"))  # fmt: skip
#: (column, numerator engine, denominator engine) of the ratio columns
_RATIOS = (("pgx/ORT", "pygraphx", "ort"), ("pgx/OV f32", "pygraphx", "ov_f32"),
           ("pgx bf16/OV default", "pgx_bf16", "ov_default"))  # fmt: skip


def _ratio(ms: dict[str, float], a: str, b: str) -> str:
    return f"{ms[a] / ms[b]:.2f}" if a in ms and b in ms else "-"


def _bf16_errors(r: dict[str, Any]) -> str:
    """The relative error vs fp32 of pygraphx bf16 / OpenVINO's default precision."""
    rel = r["rel_rms_error_vs_ort_fp32"]
    return " / ".join(f"{rel[k]:.1e}" if k in rel else "-" for k in ("pgx_bf16", "ov_default"))


def _print_table(results: list[dict[str, Any]], threads: int) -> None:
    shown = [(k, t) for k, t in _ENGINES if any(k in r["ms"] for r in results)]
    columns = ["model", "batch", "threads"]
    columns += [f"{t} ms (own CPU ms)" for _, t in shown] + [c for c, _, _ in _RATIOS]
    columns += ["pgx/ORT own CPU"]
    columns += ["rel err bf16 pgx / OV default", "compile pgx s", "ORT s"]
    rows = []
    for r in results:
        ms, cpu, cs = r["ms"], r["own_cpu_ms"], r["compile_s"]
        cells = [r["model"], str(r["batch"]), str(threads)]
        cells += [f"{ms[k]:.2f} ({cpu[k]:.1f})" if k in ms else "-" for k, _ in shown]
        cells += [_ratio(ms, a, b) for _, a, b in _RATIOS]
        cells += [f"{r['own_cpu_over_ort']['pygraphx']:.2f}"]
        cells += [_bf16_errors(r), f"{cs['pygraphx']:.2f}", f"{cs['ort']:.2f}"]
        rows.append(cells)
    widths = [max(len(c), *(len(row[k]) for row in rows)) for k, c in enumerate(columns)]
    print()
    print("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
