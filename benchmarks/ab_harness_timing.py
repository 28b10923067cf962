"""The A/B harness's timing (`benchmarks/ab_harness.py` has the whole story): the machine's
state (`busy`, `wait_quiet`, `loadavg`, the thread adaptation switches the harness fixes), the
clocks, the rounds of alternating blocks (`round_order`, `time_rounds`) and their statistics
(`summarize`), and the per-step timing of `--steps` (`steps_by_kind`, `profiled`).
"""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def cpu_stat() -> list[int]:
    """The machine's CPU time counters (/proc/stat's first line)."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]


def busy_between(a: list[int], b: list[int]) -> float:
    """The fraction of the machine's CPU time spent busy between two `cpu_stat()`s (this
    process's own work included); NaN where no tick passed (the counters are in 10 ms ticks)."""
    d = [y - x for x, y in zip(a, b, strict=True)]
    total = sum(d[:8])
    return 1.0 - (d[3] + d[4]) / total if total > 0 else float("nan")


def busy(seconds: float = 2.0) -> float:
    """The fraction of the machine's CPU time spent busy over `seconds` (/proc/stat)."""
    a = cpu_stat()
    time.sleep(seconds)
    seen = busy_between(a, cpu_stat())
    return 0.0 if seen != seen else seen  # (NaN: no tick in `seconds`)


def wait_quiet(limit: float) -> str:
    """Wait at most `limit` seconds for busy < 15 % over 2 s; says what was seen."""
    end = time.monotonic() + limit
    while True:
        b = busy()
        if b < 0.15:
            return f"quiet (busy {b:.0%} over 2 s)"
        if time.monotonic() > end:
            return f"NOT quiet (busy {b:.0%} over 2 s after waiting {limit:.0f} s)"


def loadavg() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter, "process": time.process_time}
CLOCK_NAMES = {"thread": "thread CPU", "wall": "wall", "process": "process CPU"}


def profiled(prog: Any, feeds: dict, clock: Callable[[], float]) -> list[float]:
    """Each step of one run of `prog`, timed alone."""
    exe = prog._executable
    out = []
    exe.executor.bind(feeds)
    with exe.scope():
        for fn in exe.executor.steps:
            start = clock()
            fn()
            out.append(clock() - start)
    exe.executor.collect()
    return out


def round_order(names: list[str], r: int) -> list[str]:
    """Round `r`'s order of `names`: reversed every other round; with 3 or more, also rotated
    by one every two rounds, so that each takes every position (reversal alone keeps the
    middle one in the middle)."""
    k = (r // 2) % len(names) if len(names) > 2 else 0
    rotated = names[k:] + names[:k]
    return rotated if r % 2 == 0 else rotated[::-1]


def steps_by_kind(progs: dict, names: list[str], feeds: dict, rounds: int, clock,
                  kind_of) -> tuple[dict, dict]:  # fmt: skip
    """Each lowered step's median time over `rounds` profiled runs (`profile.time_steps`: a
    chain of convolutions times its members itself), summed per kind, ms a run; and the same
    of each step's fastest time."""
    from pygraphx.targets.cpu.profile import time_steps

    if kind_of is None:
        from benchmarks.gemm14_profile import pgx_kind as kind_of

    runs: dict[str, list[list[float]]] = {n: [] for n in names}
    for r in range(rounds):
        for n in round_order(names, r):
            timed = time_steps(progs[n]._executable, feeds, 1, clock)
            runs[n].append([st.seconds for st in timed])
    per, fast = {}, {}
    for n in names:
        arr = np.array(runs[n])
        for table, col in ((per, np.median(arr, axis=0)), (fast, arr.min(axis=0))):
            acc: dict[str, float] = defaultdict(float)
            for st, t in zip(progs[n]._executable.lowered.steps, col, strict=True):
                acc[kind_of(st)] += float(t) * 1e3
            table[n] = dict(acc)
    return per, fast


def auto_runs(prog: Any, feeds: dict) -> int:
    """Runs for about 0.2 s a block, by three runs of `prog` (`--runs 0`)."""
    t0 = time.perf_counter()
    for _ in range(3):
        prog.run(feeds)
    return max(2, int(0.2 / max((time.perf_counter() - t0) / 3, 1e-6)))


@dataclass
class Timing:
    """What `time_rounds` measured: each variant's blocks, ms a run of the clock and of the
    process's CPU time, and the machine's busy share during them (all of it, and the others':
    this process's CPU time taken out; NaN where too short to tell)."""

    times: dict[str, list[float]]
    cpu: dict[str, list[float]]
    during: float
    others: float


def time_rounds(progs: dict[str, Any], order: list[str], feeds: dict, rounds: int, runs: int,
                settle: int, clock: Callable[[], float]) -> Timing:  # fmt: skip
    """`rounds` rounds; in each, every variant (`progs`, run in `order` turned by
    `round_order`) runs `settle` untimed runs, then one block of `runs` timed runs."""
    times: dict[str, list[float]] = {n: [] for n in progs}  # (as declared)
    cpu: dict[str, list[float]] = {n: [] for n in progs}
    stat0, proc0, wall0 = cpu_stat(), time.process_time(), time.perf_counter()
    for r in range(rounds):
        for n in round_order(order, r):
            prog = progs[n]
            for _ in range(settle):
                prog.run(feeds)
            c0, t0 = time.process_time(), clock()
            for _ in range(runs):
                prog.run(feeds)
            times[n].append((clock() - t0) / runs * 1e3)
            cpu[n].append((time.process_time() - c0) / runs * 1e3)
    # the machine during the timing: all its busy CPU time, and the others' (ours taken out)
    stat1, proc1, wall1 = cpu_stat(), time.process_time(), time.perf_counter()
    during = busy_between(stat0, stat1)
    cpus = os.cpu_count() or 1
    ours = (proc1 - proc0) / max(1e-9, (wall1 - wall0) * cpus)
    others = during if during != during else max(0.0, during - ours)  # (NaN: too short)
    return Timing(times, cpu, during, others)


@dataclass
class Stats:
    """Each variant's figures from its blocks (ms a run): median, best block, median process
    CPU, the median of the rounds' difference from the first variant (adjacent blocks: robust
    to drifting load), the 25th percentile block and the median of the rounds' ratios to the
    first variant (what a loaded machine needs besides the median: gpt17's figures)."""

    med: dict[str, float]
    best: dict[str, float]
    cpu_med: dict[str, float]
    paired: dict[str, float]
    p25: dict[str, float]
    paired_ratio: dict[str, float]


def summarize(timing: Timing, first: str) -> Stats:
    """`Stats` of `timing`'s blocks, the differences and ratios to variant `first`."""
    times, cpu = timing.times, timing.cpu
    nan = float("nan")
    return Stats(
        med={n: statistics.median(t) if t else nan for n, t in times.items()},
        best={n: min(t, default=nan) for n, t in times.items()},
        cpu_med={n: statistics.median(t) if t else nan for n, t in cpu.items()},
        paired={n: statistics.median(np.subtract(t, times[first])) if t else nan
                for n, t in times.items()},
        p25={n: float(np.percentile(t, 25)) if t else nan for n, t in times.items()},
        paired_ratio={n: statistics.median(np.divide(t, times[first])) if t else nan
                      for n, t in times.items()},
    )  # fmt: skip


#: the run-time thread controls of the cpu target (`scheduling.py`): `PGX_CPU_LOAD_ADAPT` is
#: read at every run (under load it runs a "t2" A/B on 1 thread), `PGX_CPU_STALL_ADAPT` when a
#: program compiles (A and B could run at different counts): `run` sets both to 0 unless they
#: are set already or `--keep-adapt` is given
ADAPT_KEYS = ("PGX_CPU_LOAD_ADAPT", "PGX_CPU_STALL_ADAPT")


def fix_adaptation(keep: bool = False) -> dict[str, str | None]:
    """Default the adaptation switches to 0 (`keep`: leave them as they are); their values."""
    if not keep:
        for key in ADAPT_KEYS:
            os.environ.setdefault(key, "0")
    return {key: os.environ.get(key) for key in ADAPT_KEYS}


def describe_adaptation(values: dict[str, str | None]) -> str:
    return ", ".join(f"{k}={'(unset: on)' if v is None else v}" for k, v in values.items())
