"""pygraphx beside neighbours that keep cores busy: the stall adaptation on and off, against ORT.

    python benchmarks/adapt15_probe.py                       # 16-core host: k = 0, 2, 4 spinners
    python benchmarks/adapt15_probe.py --threads 2 --spinners 0 1 --one --json out.json
    python benchmarks/adapt15_probe.py --threads 2 --neighbour ort-pool --one
    python benchmarks/adapt15_probe.py --quiet-ab --threads 2   # the quiet case only, A/B

For each model (default MobileNetV2, BERT-base, ResNet-50, batch 1) one process compiles
pygraphx twice with `threads=N` (`on`: `PGX_CPU_STALL_ADAPT=1` at compile, `off`: 0; with
`--one` also a program on 1 thread) and makes an ONNX Runtime session with
`intra_op_num_threads=N`, and warms every engine up on the quiet machine (so the adaptation
knows the program's quiet best). Then for each k of `--spinners`: start the neighbour, right
before the timing (the 1-minute load average has not seen it yet; the script sets
`PGX_CPU_LOAD_ADAPT=0` unless `--load-adapt`, so the load rule does not act on the load other
work left behind), time blocks of single runs of each engine (`--block-s` seconds, at least
`--min-runs` runs), the engines in order and then in reverse (`--rounds`), stop the
neighbour (always, in a `finally`). Neighbours: `process` (default): k processes that spin
(`while True: pass`); `ort-pool`: in this process, one run of another ORT session
(MobileNetV2 b1, `intra_op_num_threads=N`, ORT's default spinning pool) before every timed
run (k > 0 turns it on). A row per model and k: each engine's median ms over its runs, `on`'s
mean thread count and how often it lowered / restored, and on/ORT, off/ORT.

`--recovery`: after the last k, with the neighbours gone, runs `on` until it is back on N
threads (at most 10 s) and reports how long that took.

`--quiet-ab`: no neighbour: `on` and `off` in alternating blocks, both orders, the quiet
cost of the adaptation (the median per engine and the per-round ratios); with
`--same-program` one compiled program runs both, its controller attached or not per block
(two compiles can differ by a few % through their measured kernel choices).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402  (before torch: pygraphx sets OpenMP's spin count)
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.cpu.threads import (  # noqa: E402
    LOAD_ADAPT_ENV,
    STALL_ADAPT_ENV,
    resolve_threads,
)

MODELS = ("mobilenetv2", "bert_base", "resnet50")


def compile_pgx(model: Any, threads: int, stall: str) -> Any:
    from pygraphx.targets.cpu.target import CpuTarget

    saved = os.environ.get(STALL_ADAPT_ENV)
    os.environ[STALL_ADAPT_ENV] = stall
    try:
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        prog.compile(CpuTarget(threads=threads))
    finally:
        if saved is None:
            os.environ.pop(STALL_ADAPT_ENV, None)
        else:
            os.environ[STALL_ADAPT_ENV] = saved
    return prog


def make_ort(model: Any, threads: int) -> Callable[[dict], Any]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)


class Neighbours:
    """k spinning processes, or an in-process ORT pool run before every timed run."""

    def __init__(self, kind: str, threads: int) -> None:
        self.kind = kind
        self.procs: list[subprocess.Popen] = []
        self.before: Callable[[], None] = lambda: None
        self._ort: Callable[[], Any] | None = None
        if kind == "ort-pool":
            m = get_model("mobilenetv2", batch=1)
            feeds = model_inputs("mobilenetv2", m)
            run = make_ort(m, threads)
            self._ort = lambda: run(feeds)

    def start(self, k: int) -> None:
        if k <= 0:
            return
        if self.kind == "process":
            for _ in range(k):
                self.procs.append(
                    subprocess.Popen([sys.executable, "-c", "while True: pass"])  # noqa: S603
                )
        else:
            assert self._ort is not None
            self.before = self._ort

    def stop(self) -> None:
        self.before = lambda: None
        procs, self.procs = self.procs, []
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def stall_of(prog: Any) -> Any:
    return prog._executable.scope.stall


def used_threads(prog: Any) -> int:
    return prog._executable.scope.limit[0]


def block(
    name: str, run: Callable[[], Any], prog: Any, before: Callable[[], None], seconds: float,
    min_runs: int, out: dict[str, list],
) -> None:  # fmt: skip
    end = time.perf_counter() + seconds
    k = 0
    while k < min_runs or time.perf_counter() < end:
        before()
        start = time.perf_counter()
        run()
        out[name].append((time.perf_counter() - start) * 1e3)
        if prog is not None:
            out[name + "_threads"].append(used_threads(prog))
        k += 1


def summary(times: list[float]) -> float:
    return statistics.median(times) if times else float("nan")


def run_model(args: argparse.Namespace, name: str, neighbours: Neighbours) -> list[dict]:
    model = get_model(name, batch=args.batch)
    feeds = model_inputs(name, model)
    n = args.threads
    progs: dict[str, Any] = {
        "on": compile_pgx(model, n, "1"),
        "off": compile_pgx(model, n, "0"),
    }
    if args.one:
        progs["one"] = compile_pgx(model, 1, "0")
    engines: dict[str, Callable[[], Any]] = {
        k: (lambda p=p: p.run(dict(feeds))) for k, p in progs.items()
    }
    if not args.quiet_ab:
        engines["ort"] = (lambda r=make_ort(model, n): r(feeds))
    for _ in range(args.warmup):
        for run in engines.values():
            run()
    rows = []
    if args.quiet_ab:
        return [quiet_ab(args, name, engines, progs)]
    on = stall_of(progs["on"])
    for k in args.spinners:
        times: dict[str, list] = {e: [] for e in engines}
        times.update({e + "_threads": [] for e in progs})
        moves = (on.lowered, on.restored)
        neighbours.start(k)
        try:
            for r in range(args.rounds):
                order = list(engines) if r % 2 == 0 else list(reversed(engines))
                for e in order:
                    block(e, engines[e], progs.get(e), neighbours.before, args.block_s,
                          args.min_runs, times)  # fmt: skip
        finally:
            neighbours.stop()
        row: dict[str, Any] = {"model": name, "batch": args.batch, "threads": n, "k": k}
        for e in engines:
            row[e] = summary(times[e])
            row[e + "_runs"] = len(times[e])
        row["on_threads_mean"] = statistics.fmean(times["on_threads"])
        row["on_lowered"] = on.lowered - moves[0]
        row["on_restored"] = on.restored - moves[1]
        row["on_count_at_end"] = on.count
        row["on_over_ort"] = row["on"] / row["ort"]
        row["off_over_ort"] = row["off"] / row["ort"]
        row["times"] = {e: times[e] for e in engines}
        row["threads_used"] = {e: times[e + "_threads"] for e in progs}
        rows.append(row)
        print(fmt_row(row, list(engines)), flush=True)
    if args.recovery:
        rows[-1]["recovery_s"] = recovery(engines["on"], on)
        print(f"  {name}: back on {n} threads {rows[-1]['recovery_s']:.2f} s after the "
              "neighbours stopped", flush=True)  # fmt: skip
    return rows


def recovery(run: Callable[[], Any], stall: Any) -> float:
    start = time.perf_counter()
    while stall.count < stall.n and time.perf_counter() - start < 10.0:
        run()
    return time.perf_counter() - start


def quiet_ab(
    args: argparse.Namespace, name: str, engines: dict[str, Callable], progs: dict[str, Any]
) -> dict:
    times: dict[str, list] = {e: [] for e in ("on", "off")}
    times.update({e + "_threads": [] for e in ("on", "off")})
    ratios = []
    scope = progs["on"]._executable.scope
    controller = scope.stall
    for r in range(args.rounds):
        order = ["on", "off"] if r % 2 == 0 else ["off", "on"]
        got = {}
        for e in order:
            before = len(times[e])
            if args.same_program:  # one program, its controller attached or not
                scope.stall = controller if e == "on" else None
                run, prog = engines["on"], progs["on"]
            else:
                run, prog = engines[e], progs[e]
            block(e, run, prog, lambda: None, args.block_s, args.min_runs, times)
            got[e] = summary(times[e][before:])
        ratios.append(got["on"] / got["off"])
    on = controller
    row = {
        "model": name, "batch": args.batch, "threads": args.threads, "k": 0,
        "on": summary(times["on"]), "off": summary(times["off"]),
        "on_over_off_rounds": ratios, "on_over_off_median": statistics.median(ratios),
        "on_threads_mean": statistics.fmean(times["on_threads"]),
        "on_lowered": on.lowered, "on_restored": on.restored, "times": times,
    }  # fmt: skip
    print(
        f"{name} b{args.batch} quiet A/B, {args.threads} threads: on {row['on']:.2f} ms, "
        f"off {row['off']:.2f} ms; on/off per round "
        + " ".join(f"{x:.3f}" for x in ratios)
        + f" (median {row['on_over_off_median']:.3f}); on took {row['on_threads_mean']:.2f} "
        f"threads on average, lowered {on.lowered}x",
        flush=True,
    )
    return row


def fmt_row(row: dict, engines: list[str]) -> str:
    cells = " ".join(f"{e} {row[e]:8.2f}" for e in engines)
    return (
        f"{row['model']:12s} b{row['batch']} k={row['k']}: {cells} ms | on/ORT "
        f"{row['on_over_ort']:.2f} off/ORT {row['off_over_ort']:.2f} | on: "
        f"{row['on_threads_mean']:.2f} threads, lowered {row['on_lowered']} restored "
        f"{row['on_restored']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS + ("gpt2",))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="default: the cpu target's")
    ap.add_argument("--spinners", type=int, nargs="+", default=[0, 2, 4])
    ap.add_argument("--neighbour", choices=("process", "ort-pool"), default="process")
    ap.add_argument("--one", action="store_true", help="also a program on 1 thread")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--block-s", type=float, default=1.0)
    ap.add_argument("--min-runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--recovery", action="store_true")
    ap.add_argument("--quiet-ab", action="store_true")
    ap.add_argument(
        "--same-program", action="store_true",
        help="--quiet-ab on one compiled program, its controller attached or not per block "
        "(two compiles can differ by their measured kernel choices)",
    )  # fmt: skip
    ap.add_argument("--load-adapt", action="store_true", help="keep PGX_CPU_LOAD_ADAPT")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.threads is None:
        args.threads = resolve_threads().n
    if not args.load_adapt:
        os.environ[LOAD_ADAPT_ENV] = "0"
    load = os.getloadavg()[0]
    print(
        f"# {os.cpu_count()} CPUs, {args.threads} threads, neighbour {args.neighbour}, "
        f"load average {load:.2f}, {LOAD_ADAPT_ENV}={os.environ.get(LOAD_ADAPT_ENV, 'unset')}, "
        f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}",
        flush=True,
    )
    neighbours = Neighbours(args.neighbour, args.threads)
    rows: list[dict] = []
    start = time.perf_counter()
    try:
        for name in args.models:
            rows += run_model(args, name, neighbours)
    finally:
        neighbours.stop()
    print(f"# {time.perf_counter() - start:.0f} s in all", flush=True)
    if args.json:
        meta = {"argv": sys.argv, "load_average_start": load, "cpus": os.cpu_count(),
                "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}  # fmt: skip
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
