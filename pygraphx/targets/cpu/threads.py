"""How many threads the `cpu` target uses: per program, per step, and across concurrent runs.

This module imports no torch; `targets/cpu/target.py` applies what it decides.

**How many (per program).** `resolve_threads(explicit)` picks, first that applies:
`get_target("cpu", threads=N)` (or the driver's `--threads N`), then `PGX_CPU_THREADS`, then the
default: the *physical* cores among the CPUs this process may run on (its affinity mask; SMT
siblings count once, as two hyper-threads share one core's vector units), no more than the
cgroup CPU quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`, rounded up),
and no more than `PGX_CPU_MAX_THREADS` or `DEFAULT_CAP`.

Why a cap: past 16 threads nothing was measured. Up to 16 more threads are faster once the
team stays the same size through a run (per step below) and idle workers spin for a bounded
time (`targets/cpu/__init__.py`): `benchmarks/cpu_threads_probe.py` on the 16-core Xeon host of
the GPU machine (torch 2.11, 2026-11-26, batch 1, GOMP_SPINCOUNT 1000, ms at 4/8/16 threads,
benchmarks/results/h200host16_cpusteps_probe_4_8_16.json): ResNet-50 26.1/19.2/16.2,
MobileNetV2 4.8/7.7/5.0, BERT-base 65.8/53.5/33.5, GPT-2 92.6/60.6/45.3; 16 is the best on three
models and within 4% on the fourth. (The earlier cap of 4 was chosen when every team-size
switch ended and re-created OpenMP workers and the spin setting never applied: BERT-base
596 ms at 16 threads then, 115 ms at 4.) The probe measures latency and CPU time at any
counts on a host; its best count is what to put here (or in `PGX_CPU_MAX_THREADS` for that
host).

**Per step.** A team of N threads is only worth waking for a step with enough work: at
prepare, `step_threads` gives a step all N threads when its work is worth at least
`MIN_SPLIT_THREADS` threads (GEMMs and convolutions count multiply-adds, `MIN_MACS_PER_THREAD`
per thread; every step also counts the values it moves, `MIN_ELEMENTS_PER_THREAD` per thread:
what it reads from outside the step, as stored, a GEMM's weights included, and the result it
writes; `scheduling.step_work`), and one thread otherwise.
Never a count in between: GNU OpenMP (torch's libgomp, also under oneDNN and MKL) keeps one
pool of worker threads per calling thread, and a parallel region with a team smaller than the
one before *ends* the surplus workers, so the next larger region creates them again
(`pthread_create` and a cold stack per thread). Measured: alternating teams of 4 and 2 threads
created a new OS thread on every switch, teams of 4 and 1 none (one thread runs inline, no
region). The earlier policy (any count from 1 to N by work) switched team sizes 38 times per
MobileNetV2 run at N = 16 and churned hundreds of threads per run. The decision is made once at
compile time; a run only calls `torch.set_num_threads` where consecutive steps differ.
`PGX_CPU_STEP_THREADS=0` (or `get_target("cpu", step_threads=False)`) runs every step on N.
Neither is measurably faster on MobileNetV2 at batch 1 on 2 cores (16-core host under
`taskset -c 0-1`, 2 threads, alternating blocks: 3.96 ms a run either way, the policy faster
in 6 of 8 rounds, CPU 7.99 against 7.70 ms a run; the 2-core EPYC: 10.13 against 10.39, 4 of
8) nor at 16 threads (2.23 / 2.46 / 2.26 against 2.21 / 2.48 / 2.13 ms at three spin counts),
so the policy stays on.

**Across runs.** OpenMP teams belong to the OS thread that starts them, so two programs run from
two Python threads would each start a full team. `BUDGET` is one process-wide pool of the
physical cores this process may use (no cap): a run takes up to its N threads from it (a run
alone always gets its N; with others running it gets at most a fair share and waits while none
is free) and gives them back at the end, so concurrent runs share the cores instead of
oversubscribing them.

**A busy machine.** `load_threads` takes fewer threads where the load average shows other
work; `StallAdapt` (one per compiled program, `PGX_CPU_STALL_ADAPT`) takes fewer while the
program's own runs stall against its best, and probes its way back (`scheduling.py`'s
docstring says why and what was measured).
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pygraphx.ir.env import switch_on, whole_number
from pygraphx.targets.cpu.budget import ThreadBudget
from pygraphx.targets.cpu.machine import affinity_cpus, cgroup_cpu_limit, physical_cores

THREADS_ENV = "PGX_CPU_THREADS"
CAP_ENV = "PGX_CPU_MAX_THREADS"
STEP_POLICY_ENV = "PGX_CPU_STEP_THREADS"
LOAD_ADAPT_ENV = "PGX_CPU_LOAD_ADAPT"
STALL_ADAPT_ENV = "PGX_CPU_STALL_ADAPT"

#: default upper bound on the thread count (see the module docstring)
DEFAULT_CAP = 16

#: GEMM / convolution: multiply-adds one thread must get before another is woken (about 25 us
#: of single-core fp32 work at ~40 GFLOP/s, several times a wake-up and join)
MIN_MACS_PER_THREAD = 500_000
#: every other step: elements (read + written) per thread (torch's own grain is 32768)
MIN_ELEMENTS_PER_THREAD = 65_536
#: a step gets the whole team when its work is worth this many threads, else one thread
MIN_SPLIT_THREADS = 2

#: IR ops whose cost is counted in multiply-adds
GEMM_OPS = frozenset({"dot", "quant_dot", "convolution", "quant_convolution", "deconvolution"})


@dataclass(frozen=True)
class ThreadCount:
    """A resolved thread count and where it came from (for report headers and errors)."""

    n: int
    source: str  # "explicit", "PGX_CPU_THREADS" or "default"
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.n} ({self.source}{': ' + self.detail if self.detail else ''})"


# --- the count ----------------------------------------------------------------------------


def _positive(name: str, text: str) -> int:
    return whole_number(name, text, 1, "threads")


def default_threads(
    cpus: Iterable[int] | None = None,
    quota: float | None = None,
    cap: int | None = None,
    sysfs: Path = Path("/sys/devices/system/cpu"),
) -> ThreadCount:
    """Physical cores in the affinity mask, bounded by the cgroup quota and the cap."""
    cpus = affinity_cpus() if cpus is None else set(cpus)
    n = physical_cores(cpus, sysfs)
    detail = [f"{n} physical cores of {len(cpus)} CPUs"]
    if quota is not None and math.ceil(quota) < n:
        n = max(1, math.ceil(quota))
        detail.append(f"cgroup quota {quota:g} CPUs")
    if cap is None:
        text = os.environ.get(CAP_ENV, "").strip()
        cap = _positive(CAP_ENV, text) if text else DEFAULT_CAP
    if n > cap:
        n = cap
        detail.append(f"capped at {cap}")
    return ThreadCount(n, "default", ", ".join(detail))


def resolve_threads(explicit: int | None = None) -> ThreadCount:
    """The program's thread count: `explicit`, else `PGX_CPU_THREADS`, else the default."""
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 1:
            raise ValueError(f"cpu target: threads={explicit!r} must be a whole number >= 1")
        return ThreadCount(explicit, "explicit")
    text = os.environ.get(THREADS_ENV, "").strip()
    if text:
        return ThreadCount(_positive(THREADS_ENV, text), THREADS_ENV)
    return default_threads(quota=cgroup_cpu_limit())


def step_policy_enabled(setting: bool | None = None) -> bool:
    """Whether steps get their own thread counts (`step_threads=`, else `PGX_CPU_STEP_THREADS`,
    default on)."""
    if setting is not None:
        return bool(setting)
    return os.environ.get(STEP_POLICY_ENV, "1").strip() not in ("0", "false", "off", "no")


# --- per step -----------------------------------------------------------------------------


def step_threads(work: Sequence[tuple[str, int, int]], n: int) -> int:
    """Threads for a step covering instructions given as (op name, output elements, inner
    length): `n` or 1, never a count in between (see the module docstring). GEMM-like ops count
    `elements * inner` multiply-adds, others elements."""
    macs = sum(elems * inner for name, elems, inner in work if name in GEMM_OPS)
    elems = sum(elems for name, elems, _ in work if name not in GEMM_OPS)
    worth = max(macs // MIN_MACS_PER_THREAD, elems // MIN_ELEMENTS_PER_THREAD)
    return n if worth >= MIN_SPLIT_THREADS else 1


# --- a busy machine (see `scheduling.py`'s docstring) -------------------------------------


@functools.cache
def usable_cpus() -> int:
    """CPUs' worth of time this process may use: its affinity mask, bounded by the cgroup CPU
    quota (rounded up), at least 1; read once per process (every run asks)."""
    n = len(affinity_cpus())
    quota = cgroup_cpu_limit()
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def load_threads(
    n: int, load: float | None = None, cpus: int | None = None, usable: int | None = None
) -> int:
    """Threads a run of `n` takes on a machine whose 1-minute load average is `load` over
    `cpus` CPUs, of which this process may use `usable` (defaults: this machine's load and
    `os.cpu_count()`, and `usable_cpus()`; `usable` is `cpus` when only `cpus` is given).
    `scheduling.RunScope` applies it to every run (why: `scheduling.py`'s docstring).
    `PGX_CPU_LOAD_ADAPT=0` keeps `n`.

    The load average counts the whole machine (in a container, the host's: /proc/loadavg is
    not namespaced), so in a process confined to fewer CPUs (an affinity mask, a cgroup quota)
    the share of the others' load that falls on its CPUs is taken as proportional to them."""
    if n <= 1 or os.environ.get(LOAD_ADAPT_ENV, "1").strip() == "0":
        return n
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):  # not available on this platform (Windows)
            return n
    if usable is None:
        usable = cpus if cpus is not None else usable_cpus()
    cpus = cpus if cpus is not None else os.cpu_count() or 1
    usable = max(1, min(usable, cpus))
    others = int(max(0.0, load - n) * usable / cpus)  # whole CPUs of ours kept busy by others
    return max(1, min(n, usable - others))


# --- stalled runs (see `scheduling.py`'s docstring) --------------------------------------

#: a run is slow when it takes more than `STALL_RATIO` times the best run at its thread count
#: (and at least `STALL_MIN_EXCESS_S` more); `STALL_RUNS` slow runs are a stall (a run
#: that is not slow takes the oldest slow one out: `SlowStreak`)
STALL_RATIO = 1.6
STALL_RUNS = 3
STALL_MIN_EXCESS_S = 2e-4
#: ... and the slow runs of a stall together take at least this long: a neighbour that stays
#: for seconds is worth fewer threads, a passing one is not. On the 16-core host a 1.4 ms
#: MobileNetV2 is slow for 3 runs or so in a hiccup, and for 80-175 ms (2-7 runs of up to 100
#: ms) after an ONNX Runtime session in the same process ran: its pool spins that long after its
#: last run. With 20 ms that halved the count, and the hold (0.5 s) outlived the stall
#: (ResNet-50 b1 8.4 -> 12-15 ms, MobileNetV2 b8 5.7 -> 8-10 ms; benchmarks/results/adapt16.md)
STALL_MIN_SPAN_S = 0.25
#: runs at a thread count before its best is trusted (the first runs warm caches and pools:
#: on the 16-core host ResNet-50's first runs at 16 threads took 45-48 ms, then 8; with 3 the
#: controller halved a quiet program twice during its warm-up)
STALL_BEST_AFTER = 10
#: runs a probe takes at its count; their median decides (one run on a 16-core host is often
#: 2-4x its neighbours: a single-run probe kept a quiet ResNet-50 on 4 threads for a second)
STALL_PROBE_RUNS = 3
#: seconds a lowered count is kept before a probe tries a higher count; doubled after each
#: probe that finds the stall still there, up to `STALL_HOLD_MAX_S`
STALL_HOLD_S = 0.5
STALL_HOLD_MAX_S = 4.0
#: a program busy from its first run has a stalled best: a probe on half the threads, first
#: `STALL_DOWN_FIRST_S` after its first runs, then each time twice as long after (at most
#: `STALL_DOWN_MAX_S`), lowers the count when it is faster than `STALL_DOWN_GAIN` times the
#: full count's recent runs and than its best run
STALL_DOWN_FIRST_S = 2.0
STALL_DOWN_MAX_S = 64.0
STALL_DOWN_GAIN = 0.8
#: ... and never sooner than this many of the full count's best runs after the last try (or
#: the first runs): a try (`STALL_PROBE_RUNS` runs on half the threads) costs about that many
#: runs more, so in a quiet process the tries cost at most ~0.5 % of the run time (a 1.2 s
#: GPT-2 batch-8 run tries first after 12 minutes, a 4 ms MobileNetV2 run after 2.4 s)
STALL_DOWN_SPACING_RUNS = 600


def stall_adapt_enabled() -> bool:
    """`PGX_CPU_STALL_ADAPT` (default on): whether programs compiled now adapt to stalls."""
    return switch_on(STALL_ADAPT_ENV)


class SlowStreak:
    """The slow runs of a stall in the making and their total time: a slow run joins, a run
    that is not slow takes the oldest out (so that a neighbour letting one run in five or
    ten through, at full speed, still adds up to a stall, while a passing one leaks away)."""

    __slots__ = ("runs", "total")

    def __init__(self, runs: Iterable[float] = ()) -> None:
        self.runs: deque[float] = deque(runs)
        self.total = sum(self.runs)

    def __len__(self) -> int:
        return len(self.runs)

    def append(self, seconds: float) -> None:
        self.runs.append(seconds)
        self.total += seconds

    def leak(self) -> None:
        if self.runs:
            self.total -= self.runs.popleft()
            if not self.runs:
                self.total = 0.0  # (no drift from the float sums)

    def clear(self) -> None:
        self.runs.clear()
        self.total = 0.0


class StallAdapt:
    """Run-time feedback on one program's thread count: fewer threads while runs stall.

    `want(now)` is the count the next run should take, `record(used, seconds, now)` reports a
    finished run (the threads it held, its wall time). Per thread count it keeps the best run
    seen (after `STALL_BEST_AFTER` runs at that count; below the full count, no more than the
    full count's best times full / count); `STALL_RUNS` runs slower than
    `STALL_RATIO` times that (and by `STALL_MIN_EXCESS_S`) at the current count halve the
    count (at least 1; the slow runs spanning `STALL_MIN_SPAN_S` at least; each run that is not
    slow takes the oldest slow one out of the count, `SlowStreak`). A lowered count is
    kept for a hold time (`STALL_HOLD_S`), then a probe (`STALL_PROBE_RUNS` runs, their
    median) tries the full count (the first after a lowering: a passing hiccup gives all the
    threads back at once), then the count halfway up to the full count (rounded up: from 1 of 2, or 8 of
    9, the full count; from 8 of 16, 12): faster than the lowered runs, and it becomes the
    count (the hold time resets, so the next probe comes soon: 8 -> 12 -> 14 -> 15 -> 16 on 16
    cores while the neighbours leave 14 free, stopping where the next step stalls; a raised
    count that then stalls goes back to the count it was raised from; a faster probe of
    the full count restores it; with no lowered run to compare, a full-count probe restores
    it unless slow against its best). Otherwise the
    lowered count stays for twice the hold (at most `STALL_HOLD_MAX_S`). When
    the lowered runs are no faster than the stalled ones were, the full count comes back at
    once and stalls are not looked for during one hold time, which doubles (fewer threads did
    not help: on a machine oversubscribed by many processes more threads are a larger share of
    the cores).
    Runs at a count other than the one asked for (the process budget gave fewer) only update
    that count's best. All methods are thread-safe (one lock, held for a few arithmetic
    operations); `changes` counts the count's moves, `lowered` / `raised` / `restored` the
    three kinds, `probes` the probes."""

    def __init__(self, n: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self.n = max(1, n)
        self.count = self.n
        self.clock = clock
        self.best: dict[int, float] = {}
        self.runs: dict[int, int] = {}
        self.lowered = 0
        self.raised = 0
        self.restored = 0
        self.probes = 0
        self.last_stall = 0.0  # seconds: the median of the runs that made the last lowering
        self._slow = SlowStreak()
        self._recent: deque[float] = deque(maxlen=STALL_RUNS)  # runs at the lowered count
        self._probe_at = math.inf
        self._probe_count = 0  # the count of the probe in flight (0: none)
        self._probe_left = 0  # runs of it still to hand out
        self._probe_runs: list[float] = []  # its runs so far
        self._probe_full = False  # the next probe tries the full count (the first after a lowering)
        self._raised_from = 0  # the count before the last raise (0: none since a lowering)
        self._quiet_until = -math.inf  # no stall detection before (fewer threads did not help)
        self._hold = STALL_HOLD_S
        self._full: deque[float] = deque(maxlen=STALL_RUNS)  # recent runs at the full count
        self._down_at = math.inf  # when the next run tries half the threads
        self._down_every = STALL_DOWN_FIRST_S
        self.down_probes = 0
        self._lock = threading.Lock()
        #: `record`'s short way for the common run (run17; the run scope sets it: `RunScope`;
        #: off, the long way alone, which the short way must match: test_run17_lean_run.py)
        self._lean = False

    @property
    def changes(self) -> int:
        return self.lowered + self.raised + self.restored

    def want(self, now: float | None = None) -> int:
        """Threads for the next run: the current count, or a probe's count when one is due
        (halfway from the current count up to the full count, rounded up)."""
        now = self.clock() if now is None else now
        if self.count == self.n and now < self._down_at and not self._probe_left:
            return self.n  # the quiet case, without the lock (a stale read: one run more)
        with self._lock:
            if self._probe_left:  # a probe's further runs
                self._probe_left -= 1
                return self._probe_count
            if self.count == self.n and now >= self._down_at and self.n > 1:
                self._down_at = now + self._down_wait()  # (a lost result: the next after that)
                self.down_probes += 1
                return self._start_probe(self.n // 2)
            if self.count < self.n:
                now = self.clock() if now is None else now
                if now >= self._probe_at:
                    # one probe at a time; its `record` sets the next (a probe whose run
                    # failed, or got fewer threads, is followed by another after a hold)
                    self._probe_at = now + self._hold
                    self.probes += 1
                    if self._probe_full:  # the first after a lowering: was it a hiccup?
                        self._probe_full = False
                        return self._start_probe(self.n)
                    return self._start_probe(-(-(self.count + self.n) // 2))
            return self.count

    def record(self, used: int, seconds: float, now: float | None = None) -> str | None:
        """A finished run on `used` threads took `seconds`; returns "lowered", "raised" (a
        probe below the full count was faster) or "restored" when this run moved the count,
        else None."""
        with self._lock:
            if self._lean and used == self.count == self.n and self._down_at != math.inf and (
                not self._slow.runs
            ):  # the common run (`_lean`, run17): what the long way does for it
                best = self.best[used]  # (set: `_down_at` is finite after the first runs)
                if seconds <= STALL_RATIO * best or seconds - best <= STALL_MIN_EXCESS_S:
                    self.runs[used] += 1
                    if seconds < best:
                        self.best[used] = seconds
                    self._full.append(seconds)
                    return None
            now = self.clock() if now is None else now
            runs = self.runs.get(used, 0) + 1
            self.runs[used] = runs
            best = self.best.get(used, math.inf)
            if seconds < best:
                self.best[used] = seconds
            if used != self.count:
                if used != self._probe_count:
                    return None
                self._probe_runs.append(seconds)
                if len(self._probe_runs) < STALL_PROBE_RUNS:
                    return None
                seconds = statistics.median(self._probe_runs)
                self._probe_runs = []
                if used < self.count:
                    return self._down_probed(used, seconds, now)
                return self._probed(used, seconds, self._ref(used, best, runs), now)
            if used == self.n:
                self._full.append(seconds)
                if self._down_at == math.inf and runs > STALL_BEST_AFTER and (
                    len(self._full) == STALL_RUNS
                ):  # (after the first runs, and after each restore)
                    self._down_at = now + self._down_wait()
            if self.count > 1 and now >= self._quiet_until and (
                self._is_slow(seconds, self._ref(used, best, runs))
            ):
                self._slow.append(seconds)
                if len(self._slow) >= STALL_RUNS and self._slow.total >= STALL_MIN_SPAN_S:
                    return self._lower(now)
            else:  # (a neighbour that lets some runs through still fills the streak)
                self._slow.leak()
            if self.count < self.n:
                self._recent.append(seconds)
                if len(self._recent) == STALL_RUNS and (
                    statistics.median(self._recent) >= self.last_stall
                ):  # fewer threads are no faster: give them back, look again after a hold
                    self._quiet_until = now + self._hold  # (longer each time, as a probe's)
                    self._hold = min(2 * self._hold, STALL_HOLD_MAX_S)
                    return self._restore()
            return None

    def _ref(self, used: int, best: float, runs: int) -> float:
        """What a run on `used` threads should take: its best (trusted after
        `STALL_BEST_AFTER` runs), and below the full count no more than the full count's best
        scaled by the threads (a lowered count stalled from its first run has no quiet best
        of its own)."""
        ref = best if runs > STALL_BEST_AFTER else math.inf
        if used < self.n and self.runs.get(self.n, 0) > STALL_BEST_AFTER:
            ref = min(ref, self.best[self.n] * self.n / used)
        return ref

    @staticmethod
    def _is_slow(seconds: float, best: float) -> bool:
        return seconds > STALL_RATIO * best and seconds - best > STALL_MIN_EXCESS_S

    def _lower(self, now: float) -> str:
        self.last_stall = statistics.median(self._slow.runs)
        self._slow.clear()
        self._recent.clear()
        if 0 < self._raised_from < self.count:  # a raise that stalls: back to where it began
            self.count = self._raised_from
            self._hold = min(2 * self._hold, STALL_HOLD_MAX_S)
        else:
            self.count = max(1, self.count // 2)
        self._raised_from = 0
        self._probe_at = now + self._hold
        self._probe_full = True
        self.lowered += 1
        return "lowered"

    def _restore(self) -> str:
        self.count = self.n
        self._raised_from = 0
        self._full.clear()
        self._down_at = math.inf
        self._slow.clear()
        self._recent.clear()
        self._probe_at = math.inf
        self.restored += 1
        return "restored"

    def _start_probe(self, count: int) -> int:
        """Hand out the first of `STALL_PROBE_RUNS` runs at `count` (under the lock)."""
        self._probe_count = count
        self._probe_left = STALL_PROBE_RUNS - 1
        self._probe_runs = []
        return count

    def _down_wait(self) -> float:
        """Seconds until the next half-thread try: `_down_every`, and at least
        `STALL_DOWN_SPACING_RUNS` of the full count's best runs (the tries' cost bound)."""
        return max(self._down_every, STALL_DOWN_SPACING_RUNS * self.best.get(self.n, 0.0))

    def _down_probed(self, used: int, seconds: float, now: float) -> str | None:
        """A run on half the threads while on the full count: faster by `STALL_DOWN_GAIN`
        than the full count's recent runs and faster than its best run ever, and half is the
        count (a stall the program's own best cannot show: it was stalled from its first
        run; a neighbour that came later is the stall rule's)."""
        self._probe_count = self._probe_left = 0  # (no further probe runs: review17d)
        if self.count != self.n or len(self._full) < STALL_RUNS:
            return None
        full = statistics.median(self._full)
        if seconds < min(STALL_DOWN_GAIN * full, self.best[self.n]):
            self._slow = SlowStreak(self._full)
            return self._lower(now)  # (its `last_stall`: the full count's recent runs)
        self._down_every = min(2 * self._down_every, STALL_DOWN_MAX_S)
        self._down_at = now + self._down_wait()
        self._slow.clear()  # (a streak of slow runs is counted from the runs on each side)
        return None

    def _probed(self, used: int, seconds: float, ref: float, now: float) -> str | None:
        self._probe_count = self._probe_left = 0  # (else `want` could return 0)
        if self.count >= used:
            return None  # moved meanwhile (a concurrent run's probe)
        if self._recent:
            faster = seconds < statistics.median(self._recent)
        else:  # no run at the lowered count to compare with
            faster = used == self.n
        if used == self.n and (faster if self._recent else not self._is_slow(seconds, ref)):
            self._hold = STALL_HOLD_S
            return self._restore()
        if used < self.n and (faster if self._recent else not self._is_slow(seconds, ref)):
            self._raised_from = self.count
            self.count = used  # the neighbours leave more cores than the lowered count
            self._slow.clear()
            self._recent.clear()
            self._hold = STALL_HOLD_S
            self._probe_at = now + self._hold
            self.raised += 1
            return "raised"
        self._probe_at = now + self._hold
        self._hold = min(2 * self._hold, STALL_HOLD_MAX_S)
        return None


# --- the process-wide budget (the class: `budget.py`) ----------------------------------------


#: the process-wide pool: the physical cores this process may use (affinity and quota, no cap),
#: so two runs capped at 8 on a 16-core host both get their 8
BUDGET = ThreadBudget(default_threads(quota=cgroup_cpu_limit(), cap=1 << 30).n)


__all__ = [
    "BUDGET",
    "CAP_ENV",
    "DEFAULT_CAP",
    "LOAD_ADAPT_ENV",
    "STALL_ADAPT_ENV",
    "STEP_POLICY_ENV",
    "StallAdapt",
    "THREADS_ENV",
    "ThreadBudget",
    "ThreadCount",
    "cgroup_cpu_limit",
    "default_threads",
    "load_threads",
    "physical_cores",
    "resolve_threads",
    "stall_adapt_enabled",
    "step_policy_enabled",
    "step_threads",
    "usable_cpus",
]
