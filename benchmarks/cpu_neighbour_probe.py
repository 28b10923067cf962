"""Why a pygraphx run right after ONNX Runtime's is slower (issue 10's `--neighbour` mode).

    python benchmarks/cpu_neighbour_probe.py                       # MobileNetV2 b1
    python benchmarks/cpu_neighbour_probe.py --models resnet50 --trials 8 --json out.json

`cpu_vs_peers.py --neighbour` on 2 cores showed a pygraphx block right after ORT's running 2-3x
slower for its first ~50 ms. This probe times pygraphx's runs by how long after the work
before them they start. Each trial runs, one after another in one process:

1. the work before: ORT's block (`--ort-runs` runs) with its pool spinning after its work as by
   default (`ort_spin`: ONNX Runtime's pool spins some 2^20 pause instructions, milliseconds to
   tens of them by processor), or with `session.intra_op.allow_spinning=0` (`ort_nospin`: its
   threads never spin), or with `session.force_spinning_stop=1` (`ort_stopspin`: they spin
   within a run and stop when it ends), or a sleep as long as ORT's block (`sleep`: pygraphx's
   own OpenMP workers fall asleep alike, and no other thread runs);
2. right after, pygraphx runs back to back for `--window` seconds, on its N threads (`pgx@N`)
   or on 1 (`pgx@1`, the policy "fewer threads beside a busy neighbour"); per run the start time
   after the work before, the latency, its own CPU and the other engines' threads' CPU during it
   (`cpu_accounting`: ORT's pool still spinning shows there);
3. a pause (`--pause`), so that every pool is quiet before the next trial.

The variants (work before x pygraphx's threads) alternate within each trial, the order turned
by one each trial. The report gives, per variant and start-time bucket (ms after the work
before), the median latency, the runs and the others' CPU ms per run; the last bucket is
pygraphx's steady state. If `ort_spin` is slow in the first buckets and `ort_nospin`,
`ort_stopspin` and `sleep` are not, ORT's pool spinning after its runs is the cause; if `sleep`
is slow too, pygraphx's sleeping workers (or idle CPUs) are.

`--alternate R` adds an A/B of `GapAdaptive`, a prototype policy (1 thread when other threads
of the process kept a CPU busy since pygraphx's last run, else N) against N and 1 thread, right
after single ORT runs and alone. Results: `benchmarks/results/peerscpu.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_vs_peers import make_ort, make_pygraphx  # noqa: E402

import pygraphx  # noqa: E402, F401  (its spin setting is made before it loads torch)
from benchmarks.cpu_accounting import ThreadLedger  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402

#: the work before pygraphx's runs: ORT's block with its `make_ort` spin setting, or a sleep
BEFORE = {"ort_spin": "default", "ort_nospin": "off", "ort_stopspin": "between_runs", "sleep": ""}
#: start-time buckets, ms after the work before: [0, 10), [10, 25), ...
BUCKETS = (0.0, 10.0, 25.0, 50.0, 100.0)


def make_engines(model: Any, feeds: dict[str, np.ndarray], n: int):
    """({name: run}, the ledger, {name: pygraphx program}): pygraphx at n and at 1 thread (run
    once first, so GNU OpenMP's workers exist), ORT at n with each spin setting (pool "ort")."""
    engines: dict[str, Callable] = {}
    progs: dict[str, Any] = {}
    for count in dict.fromkeys((n, 1)):
        progs[f"pgx@{count}"] = make_pygraphx(model, "torch", count, True)[2]
        engines[f"pgx@{count}"] = progs[f"pgx@{count}"].run
        engines[f"pgx@{count}"](feeds)
    ledger = ThreadLedger()
    for name, spin in BEFORE.items():
        if not spin:
            continue
        with ledger.pool(name, "ort"):
            engines[name] = make_ort(model, n, spin)[0]
            engines[name](feeds)
    ledger.seal()
    return engines, ledger, progs


def trial(
    engines: dict[str, Callable],
    ledger: ThreadLedger,
    feeds: dict[str, np.ndarray],
    variant: tuple[str, str],
    args: argparse.Namespace,
    number: int = 0,
) -> list[dict[str, float]]:
    """One trial of `variant` (work before, pygraphx engine): its pygraphx runs, each with the
    threads it took (`args.progs`' run scope: the load adaptation may take fewer) and the
    trial's `number`."""
    before, pgx = variant
    if before == "sleep":
        time.sleep(args.sleep_s)
    else:
        for _ in range(args.ort_runs):
            engines[before](feeds)
    end = time.perf_counter()
    runs = []
    while time.perf_counter() - end < args.window:
        at = time.perf_counter() - end
        snap = ledger.start()
        start = time.perf_counter()
        engines[pgx](feeds)
        wall = time.perf_counter() - start
        window = ledger.stop(snap, pgx)
        runs.append({"at_ms": at * 1e3, "ms": wall * 1e3, "own_cpu_ms": window.own_ms,
                     "others_cpu_ms": window.others_ms,
                     "threads": args.progs[pgx]._executable.scope.limit[0],
                     "trial": number})  # fmt: skip
    time.sleep(args.pause)
    return runs


class GapAdaptive:
    """A prototype policy, not pygraphx's: run on 1 thread when, in the gap since this
    engine's last run ended, the process's other threads used at least `busy` CPUs on average
    (the process CPU time less the caller's own, over the gap's wall time: a neighbour's pool
    working or spinning), else on N. A gap under `min_gap_s` (runs back to back) takes N: no
    neighbour ran in it, and our own OpenMP workers' spin after a run would dominate it. Costs
    three clock reads a run."""

    def __init__(
        self,
        many: Callable,
        one: Callable,
        n: int,
        busy: float = 0.5,
        min_gap_s: float = 1e-3,
        clocks: Callable[[], tuple[float, float, float]] | None = None,
    ) -> None:
        self.many, self.one, self.n = many, one, n
        self.busy, self.min_gap_s = busy, min_gap_s
        self.clocks = clocks or process_clocks
        self.threads = n
        self.last: tuple[float, float, float] | None = None

    def __call__(self, feeds: dict[str, np.ndarray]) -> Any:
        now, proc, mine = self.clocks()
        self.threads = self.n
        if self.last is not None and now - self.last[0] >= self.min_gap_s:
            others = (proc - self.last[1]) - (mine - self.last[2])
            self.threads = 1 if others / (now - self.last[0]) >= self.busy else self.n
        out = (self.one if self.threads == 1 else self.many)(feeds)
        self.last = self.clocks()
        return out


def process_clocks() -> tuple[float, float, float]:
    """(wall, process CPU, calling thread's CPU) seconds: what `GapAdaptive` reads."""
    return time.perf_counter(), time.process_time(), time.thread_time()


def alternate(engines: dict[str, Callable], feeds: dict[str, np.ndarray], rounds: int):
    """pygraphx at N, at 1 and `GapAdaptive`, each timed in two settings, the variants taking
    turns each round: right after a single ORT run (`neighbour`: 5 pairs of an ORT run and a
    pygraphx run, the last 4 timed, as `cpu_vs_peers --neighbour` alternates engines) and, after
    a pause in which ORT's pool stops spinning, alone (the last 3 runs of a block of 4).
    ({setting: {variant: [ms]}}, {setting: threads the adaptive one took})."""
    pgx = [k for k in engines if k.startswith("pgx@")]
    n = max(int(k.split("@")[1]) for k in pgx)
    adapt = GapAdaptive(engines[f"pgx@{n}"], engines["pgx@1"], n)
    variants = {**{k: engines[k] for k in pgx}, "pgx@adapt": adapt}
    ms: dict[str, dict[str, list[float]]] = {"neighbour": {}, "alone": {}}
    took: dict[str, list[int]] = {"neighbour": [], "alone": []}
    for r in range(rounds):
        names = list(variants)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = variants[name]
            for setting, before in (("neighbour", engines["ort_spin"]), ("alone", None)):
                time.sleep(0.1)  # ORT's pool spins out
                for k in range(5 if before else 4):
                    if before is not None:
                        before(feeds)
                    start = time.perf_counter()
                    fn(feeds)
                    if k:
                        ms[setting].setdefault(name, []).append((time.perf_counter() - start) * 1e3)
                        took[setting] += [adapt.threads] if fn is adapt else []
    return ms, took


def bucket_of(at_ms: float) -> float:
    """The start of the bucket `at_ms` falls in."""
    return max(b for b in BUCKETS if b <= at_ms)


def paired(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per trial, against its own steady state (the median of its runs starting 100 ms or more
    after the work before; the host's drift between trials cancels): the first run's latency
    and the mean latency of the runs starting in the first 50 ms; medians over trials, with
    the median others' CPU ms in those first 50 ms."""
    first, early, others = [], [], []
    for t in sorted({r["trial"] for r in runs}):
        mine = [r for r in runs if r["trial"] == t]
        steady = [r["ms"] for r in mine if r["at_ms"] >= 100]
        if not steady:
            continue
        base = statistics.median(steady)
        first.append(mine[0]["ms"] / base)
        early.append(statistics.fmean(r["ms"] for r in mine if r["at_ms"] < 50) / base)
        others.append(sum(r["others_cpu_ms"] for r in mine if r["at_ms"] < 50))
    if not first:
        return {}
    return {
        "first_over_steady": statistics.median(first),
        "first_50ms_over_steady": statistics.median(early),
        "others_cpu_ms_first_50ms": statistics.median(others),
        "trials": len(first),
    }


def summarise(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per bucket: median latency, runs, mean own and others' CPU ms per run, mean threads."""
    out: dict[str, dict[str, float]] = {}
    for b in BUCKETS:
        got = [r for r in runs if bucket_of(r["at_ms"]) == b]
        if got:
            out[f"{b:g}"] = {
                "ms": statistics.median(r["ms"] for r in got),
                "runs": len(got),
                "own_cpu_ms": statistics.fmean(r["own_cpu_ms"] for r in got),
                "others_cpu_ms": statistics.fmean(r["others_cpu_ms"] for r in got),
                "threads": statistics.fmean(r["threads"] for r in got),
            }
    return out


def probe(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every variant's runs on one model, trials interleaved; printed per bucket."""
    model = get_model(name, batch=args.batch, seq_len=args.seq_len)
    feeds = model_inputs(name, model)
    engines, ledger, args.progs = make_engines(model, feeds, args.threads)
    start = time.perf_counter()
    for _ in range(args.ort_runs):
        engines["ort_spin"](feeds)
    args.sleep_s = time.perf_counter() - start
    pgx = [k for k in engines if k.startswith("pgx@")]
    variants = [(b, p) for b in BEFORE for p in pgx]
    runs: dict[tuple[str, str], list] = {v: [] for v in variants}
    for t in range(args.trials):
        for v in variants[t % len(variants) :] + variants[: t % len(variants)]:
            runs[v] += trial(engines, ledger, feeds, v, args, t)
    print(f"## {name} b{args.batch}, {args.threads} threads, ORT block {args.ort_runs} runs "
          f"({args.sleep_s * 1e3:.1f} ms); {ledger.describe()}; load average "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    table, pairs = report(runs)
    out = {"model": name, "batch": args.batch, "threads": args.threads,
           "ort_block_ms": args.sleep_s * 1e3, "buckets": table, "paired": pairs,
           "runs": {f"{v[0]},{v[1]}": r for v, r in runs.items()}}  # fmt: skip
    if args.alternate:
        out["alternate"], took = alternate(engines, feeds, args.alternate)
        out["adapt_threads"] = took
        for setting, got in out["alternate"].items():
            cells = ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in got.items())
            mean = statistics.fmean(took[setting])
            print(f"  {setting:9s} median ms: {cells} (adapt took {mean:.2f} threads on average)")
    return out


def report(runs: dict[tuple[str, str], list]) -> tuple[dict, dict]:
    """Print and return the per-bucket figures and the per-trial ratios of every variant."""
    print("variant (before, pygraphx): per bucket (ms after): median ms [runs] others' CPU "
          "ms/run, threads taken (mean)")  # fmt: skip
    table, pairs = {}, {}
    for v, got in runs.items():
        table[f"{v[0]},{v[1]}"] = s = summarise(got)
        cells = "  ".join(
            f"{b}: {c['ms']:7.2f} [{c['runs']:3d}] {c['others_cpu_ms']:5.2f} t{c['threads']:.1f}"
            for b, c in s.items()
        )
        print(f"  {v[0]:12s} {v[1]:7s} {cells}", flush=True)
    print("per trial against its own steady state (median over trials):")
    for v, got in runs.items():
        pairs[f"{v[0]},{v[1]}"] = p = paired(got)
        if p:
            print(f"  {v[0]:12s} {v[1]:7s} first run {p['first_over_steady']:.2f}x, runs in the "
                  f"first 50 ms {p['first_50ms_over_steady']:.2f}x; others' CPU in them "
                  f"{p['others_cpu_ms_first_50ms']:.1f} ms")  # fmt: skip
    return table, pairs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mobilenetv2"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="default: the cpu target's")
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--ort-runs", type=int, default=3, help="ORT's runs before each window")
    ap.add_argument("--window", type=float, default=0.15, help="seconds of pygraphx runs")
    ap.add_argument("--pause", type=float, default=0.2, help="seconds between trials")
    ap.add_argument("--alternate", type=int, default=0, help="rounds of the GapAdaptive A/B")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from pygraphx.targets.cpu.threads import resolve_threads

    args.threads = resolve_threads(args.threads).n
    print(f"# {os.cpu_count()} CPUs visible, affinity {len(os.sched_getaffinity(0))}; "
          f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'unset')}, PGX_CPU_LOAD_ADAPT="
          f"{os.environ.get('PGX_CPU_LOAD_ADAPT', 'unset')}")  # fmt: skip
    results = [probe(name, args) for name in args.models]
    if args.json is not None:
        args.json.write_text(json.dumps({"results": results}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
