"""Applying the thread policy of `threads.py` to a lowered program (torch's side of it).

At prepare, `plan_step_threads` gives every step its thread count and `with_thread_switches`
wraps the steps where the count changes from the step before, so a run calls
`torch.set_num_threads` only at those boundaries. `RunScope` is the executor's context for one
run: it takes the run's threads from the process-wide budget, sets them on the running OS thread,
runs under `torch.inference_mode()`, and on exit gives the threads back and restores the
caller's torch thread count (each only where the count differs: `SKIP_SAME_COUNT`).

Busy machine: OpenMP and oneDNN split a step's work statically over the team and then wait
at a barrier, so when other processes keep the cores busy every step waits for the slowest
thread to get a time slice (ONNX Runtime's pool hands out work dynamically and does not). On
the 2-core development machine at a load average of about 12, BERT-base at batch 1 took a
median 2,881 ms on 2 threads and 854 ms on 1 (ORT on 2 threads: 1,239 ms; one process, runs
interleaved). So a run takes `load_threads(n)` threads: the 1-minute load average less this
run's own n, rounded down, is the CPUs others keep busy, and the run takes no more threads
than the CPUs left (at least 1); a run scope reads it again at most every `LOAD_CHECK_S`
(1 s; the kernel updates the load average every 5 s). In a process confined to fewer CPUs
than the machine has (an affinity mask, a cgroup quota: `threads.usable_cpus`), "the CPUs"
are the ones it may use and the others' load is counted in proportion to them (the load
average is machine-wide). An idle machine, or one whose load is this program's own (or
exceeds it by less than one CPU: spinning pools of other engines in the process), keeps n;
the first run that takes fewer says so (log level INFO). `PGX_CPU_LOAD_ADAPT=0` keeps n always.
A neighbour that keeps less than a whole CPU busy is not seen, and one that this program runs
rarely beside may be counted as this program's own (the load average cannot tell them apart).

Stalled runs: the load average needs about a minute to see a new neighbour (a freshly started
16-core host collapsed pygraphx 5-18x with a normal-looking load average while ORT kept its
times), and it does not see every neighbour (another engine's spinning pool in this process;
`benchmarks/results/peerscpu.md`). So each program's run scope also keeps a
`threads.StallAdapt` (`PGX_CPU_STALL_ADAPT`, on by default, read when the program is
compiled): it is fed every run's wall time (two `perf_counter` calls a run; profiled runs
excluded) with the threads the run held, keeps the best run per thread count, and after
`STALL_RUNS` (3) runs slower than `STALL_RATIO` (1.6) times that best (each run that is not
slow taking the oldest slow one out; the best trusted after `STALL_BEST_AFTER`, 10, runs at
that count: a first run's warm-up is not a stall; and together at least `STALL_MIN_SPAN_S`,
0.25 s: a hiccup, or another pool spinning on after its last run, is not either) halves the
count the next runs take (at least 1; again if the lowered runs stall too). After a hold
(`STALL_HOLD_S`, 0.5 s) a probe (`STALL_PROBE_RUNS`, 3 runs: their median, as one run on a
16-core host is often 2-4x its neighbours) tries the full count first (a passing hiccup
gives all threads back at once), then the count halfway back up to the full count (on 2
cores the full count): faster than the lowered runs, and it is the new count (16 threads
halved to 8 climb 12, 14, 15 while the neighbours leave that many cores free; a probe of
the full count that is faster gives the full count back); else the hold doubles
(at most `STALL_HOLD_MAX_S`, 4 s), so a neighbour that leaves gives the threads back within
seconds and one that stays costs three slow runs every 4 s. Lowered runs that are no
faster than the stalled ones give the full count back at once and stalls are not looked for
during a hold, which doubles (fewer threads did not help: on a machine oversubscribed by many
processes more threads are a larger share of the cores). The first lowering says so (INFO).
A program busy from its first run (a freshly started host's) has a stalled best, so no run
is slow against it: a probe on half the threads, 2 s after its first runs and then 4, 8, ...
64 s apart (and no sooner than `STALL_DOWN_SPACING_RUNS`, 600, of its runs after the last),
lowers the count when it beats both 0.8x the full count's recent runs and the
full count's best (measured on 2 cores, the other helpers' load from the start: ResNet-50
66.5 ms against 94.9 without the rule, 1 thread 64.4; `benchmarks/results/adapt15.md`). On
a quiet machine such a probe costs what half the threads lose, at most ~0.5 % of the time.
Why halving and not the count the neighbours leave free: run times do not say how many cores
are busy, and /proc/stat, read on the slow runs, would miss neighbours in this process
(their CPU time is this process's) and cannot resolve runs of a few milliseconds (10 ms
ticks); a half that still stalls is halved again, and the probes climb back from it.
Measured (2 cores, 2 threads, one spinning process started right before the timing,
`benchmarks/results/adapt15.md`): MobileNetV2 b1 15.3 ms against 36.6 without the rule (ORT
23.8), ResNet-50 87 against 105 (ORT 115); quiet,
the rule costs 0.8 us a run (`benchmarks/adapt15_scope_cost.py`).

OpenMP's thread count (used by torch's own kernels and oneDNN) belongs to the OS thread, and
so does MKL's (packed GEMMs): torch's `set_num_threads` sets it with MKL's thread-local setter
(torch 2.13: another Python thread setting 1 leaves this thread's MKL count at 2, review16b),
so concurrent runs keep their own counts. (A thread's first `torch.get_num_threads()` reads the
last count any thread set; the run scope reads its `before` through it, so it restores that.)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from math import prod
from typing import Any

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.cpu.threads import (
    BUDGET,
    GEMM_OPS,
    LOAD_ADAPT_ENV,
    STALL_ADAPT_ENV,
    StallAdapt,
    load_threads,
    stall_adapt_enabled,
    step_threads,
    usable_cpus,
)
from pygraphx.targets.torch_lowering.context import Step

log = logging.getLogger("pygraphx.cpu")

#: seconds a run scope keeps the thread count it took from the load average (and
#: `PGX_CPU_LOAD_ADAPT`) before reading them again
LOAD_CHECK_S = 1.0

#: a run sets torch's thread count only where it changes: the run scope's enter when the
#: caller's count is not the run's, its exit when the last step's is not the caller's, and
#: the first step's switch not when it is the run's (`with_thread_switches`' `start`).
#: `torch.set_num_threads` costs 3-9 us cold (OpenMP's, MKL's and the pthreadpool's counts),
#: three times a run before (mnv16). OpenMP's and MKL's counts are the OS thread's own (read
#: back by `torch.get_num_threads`; see the module docstring). Read when a scope is made (a
#: program's compile); False: set it each time (the old path, A/B).
SKIP_SAME_COUNT = True


def set_threads(n: int) -> None:
    """Threads for torch's next kernels on this OS thread (OpenMP's and MKL's counts, both per
    thread)."""
    torch.set_num_threads(n)


def step_work(instructions: Sequence[Instruction]) -> list[tuple[str, int, int]]:
    """The work of a step computing `instructions`, as `threads.step_threads` counts it: each
    GEMM-like op's (name, output elements, inner length), and one ("memory", elements, 1) for
    the values the step touches: every instruction's result, and the inputs it reads from
    outside the step as stored. A broadcast operand counts the values it holds (a bias
    broadcast over a 7x7x960 output counted as 47k values before), a GEMM's weights count in
    full (a matrix-vector product is bound by reading them: BERT's 768x768 pooler went to one
    thread on 0.6M multiply-adds), and a gather counts the rows it picks (twice its output),
    not its whole table. A value one instruction of the step hands to the next counts once,
    as the first one's result."""
    inside = {id(i) for i in instructions}
    work: list[tuple[str, int, int]] = []
    moved = 0
    for ins in instructions:
        name = ins.op.name
        if name in GEMM_OPS and len(ins.inputs) >= 2:
            work.append((name, ins.shape.elements(), _inner(ins)))
        moved += _stored(ins)
        reads = ins.inputs
        if name == "gather" and reads:
            moved += ins.shape.elements()
            reads = reads[1:]
        moved += sum(_stored(i) for i in reads if id(i) not in inside)
    work.append(("memory", moved, 1))
    return work


def _inner(ins: Instruction) -> int:
    """Multiply-adds per output element of a GEMM-like instruction."""
    if ins.op.name in ("dot", "quant_dot"):
        return ins.inputs[0].shape.lens()[-1]
    return prod(ins.inputs[1].shape.lens()[1:])  # convolutions: (channels / group) x kernel


def _stored(ins: Instruction) -> int:
    """Values of `ins` held in memory (a broadcast view holds fewer than it shows)."""
    shape = ins.shape
    return min(shape.elements(), shape.element_space())


#: a global pooling (every output spatial length 1) runs on all the run's threads, whatever its
#: size: the 1-thread policy would switch torch's count down and back up around it, which costs
#: more than the step's split (MobileNetV2 b1, 2 threads: `torch.set_num_threads(1)` 8-16 us
#: cold in a run, the 64k-value pool 19 us on 2 threads against 28 on 1 with its switch;
#: `benchmarks/results/tail12.md`). False: the size rule alone (the old path, for A/B).
GLOBAL_POOL_ALL_THREADS = True


def plan_step_threads(steps: Sequence[Step], n: int, enabled: bool) -> list[int]:
    """Each step's thread count (all `n` when the per-step policy is off)."""
    if not enabled or n == 1:
        return [n] * len(steps)
    return [
        n if _global_pool(s.instructions) else step_threads(step_work(s.instructions), n)
        for s in steps
    ]


def _global_pool(instructions: Sequence[Instruction]) -> bool:
    """A step of one pooling whose output is one value per channel (`GLOBAL_POOL_ALL_THREADS`)."""
    if not GLOBAL_POOL_ALL_THREADS or len(instructions) != 1:
        return False
    ins = instructions[0]
    lens = ins.shape.lens()
    return ins.op.name == "pooling" and len(lens) > 2 and all(x == 1 for x in lens[2:])


def with_thread_switches(
    fns: Sequence[Callable[[], None]],
    counts: Sequence[int],
    limit: list[int],
    start: int | None = None,
) -> list[Callable[[], None]]:
    """`fns`, each first one of a run of equal counts wrapped to set its count (never more
    than `limit[0]`, the threads this run holds). `start`: the count the run scope sets
    before the first step (its n: `RunScope` sets `limit[0]`, which is min(n, limit[0])), so
    a first step of that count is not wrapped (`SKIP_SAME_COUNT`); None: it is."""
    out: list[Callable[[], None]] = []
    before = start if SKIP_SAME_COUNT else None
    for fn, count in zip(fns, counts, strict=True):
        out.append(fn if count == before else _switching(fn, count, limit))
        before = count
    return out


def _switching(fn: Callable[[], None], count: int, limit: list[int]) -> Callable[[], None]:
    def step() -> None:
        set_threads(min(count, limit[0]))
        fn()

    return step


class RunScope:
    """The context of one run (see the module docstring); `limit[0]` is the run's threads.

    `stall`: a `StallAdapt` for this scope's runs (default: one when `PGX_CPU_STALL_ADAPT` is
    on), fed each run's wall time from entry to exit while `timed` is true (the executable
    clears it for profiled runs); False: none (prepare's scope)."""

    def __init__(self, n: int, stall: bool | None = None) -> None:
        self.n = n
        self.limit = [n]
        on = stall_adapt_enabled() if stall is None else stall
        self.stall: StallAdapt | None = StallAdapt(n) if on and n > 1 else None
        self.timed = True
        self._perf = time.perf_counter
        self._told_stall = False
        # read once: os.cpu_count() costs some 12 us per call (sysfs), a run should not
        self._cpus = os.cpu_count() or 1
        self._usable = usable_cpus()
        self._saved: list[tuple[int, Any, int, float]] = []
        self._told = False
        # inference mode through torch's own guard (what `torch.inference_mode` makes and
        # enters): `torch.inference_mode`'s Python cost 8-14 us a run on each side, cold after
        # the steps (MobileNetV2 b1, 2 threads)
        self._inference = getattr(torch._C, "_InferenceMode", torch.inference_mode)
        # the threads the load allows, read again once `LOAD_CHECK_S` has passed (the kernel
        # updates the load average every 5 s; reading it cost 9-34 us a run, cold)
        self._want = n
        self._check_at = -1.0
        self._clock = time.monotonic
        self._skip = SKIP_SAME_COUNT
        self._get = torch.get_num_threads
        # (run17) the stall controller's `record` takes its short way for the common run
        # (full count, after the first runs, not slow: one lock, no calls)
        if self.stall is not None:
            self.stall._lean = True
        #: whether some step may set torch's thread count (`with_thread_switches` wrapped
        #: one): the executable clears it when none does, and the exit then reads the count
        #: back only where the enter set another (run17)
        self.switches = True

    def __call__(self) -> RunScope:
        return self

    def _load_threads(self) -> int:
        """`load_threads` for this scope's n, read again only after `LOAD_CHECK_S`."""
        now = self._clock()
        if now >= self._check_at:
            self._want = load_threads(self.n, cpus=self._cpus, usable=self._usable)
            self._check_at = now + LOAD_CHECK_S
        return self._want

    def __enter__(self) -> RunScope:
        before = self._get()
        want = self._load_threads()
        if want < self.n and not self._told:
            self._told = True
            log.info(
                "cpu: the machine is busy (load average %.1f on %d CPUs): runs take %d of %d "
                "threads while it stays so (%s=0 keeps them all)",
                os.getloadavg()[0], self._cpus, want, self.n, LOAD_ADAPT_ENV,
            )  # fmt: skip
        stall = self.stall
        if stall is not None and not self._saved:  # (a run inside a run: the outer one's)
            want = min(want, stall.want())
        got = BUDGET.acquire(want)
        if got < want:
            log.info("cpu: %d of %d threads free (other runs hold the rest)", got, want)
        self.limit[0] = got
        if got != before or not self._skip:
            set_threads(got)  # the profiled path runs every step on the run's threads
        mode = self._inference(True)
        mode.__enter__()
        self._saved.append((before, mode, got, self._perf()))
        return self

    def __exit__(self, *exc: object) -> None:
        before, mode, got, start = self._saved.pop()
        end = self._perf()
        try:
            mode.__exit__(*exc)
            if not self._skip:
                torch.set_num_threads(before)
            elif (
                got != before or self.switches or not self.timed
            ) and self._get() != before:
                # a step's switch, `got`, or an observer / profiled run (`timed` off): any of
                # them may have changed the count (review17d)
                torch.set_num_threads(before)
        finally:
            BUDGET.release()
        stall = self.stall
        if stall is not None and self.timed and exc[0] is None and not self._saved:
            if stall.record(got, end - start, end) is not None:
                self._tell(stall)

    def _tell(self, stall: StallAdapt) -> None:
        """Log a move of the stall count: the first lowering at INFO, the rest at DEBUG."""
        if stall.count < stall.n and not self._told_stall:
            self._told_stall = True
            log.info(
                "cpu: runs stalled (%.2f ms a run against a best of %.2f ms on %d threads: "
                "other work holds some cores): runs take %d of %d threads, trying %d again "
                "every few seconds (%s=0 keeps them all)",
                stall.last_stall * 1e3, stall.best.get(stall.n, 0.0) * 1e3, stall.n,
                stall.count, stall.n, stall.n, STALL_ADAPT_ENV,
            )  # fmt: skip
        else:
            log.debug("cpu: stall adaptation: runs take %d of %d threads", stall.count, stall.n)


__all__ = [
    "LOAD_ADAPT_ENV",
    "SKIP_SAME_COUNT",
    "STALL_ADAPT_ENV",
    "RunScope",
    "load_threads",
    "plan_step_threads",
    "set_threads",
    "step_work",
    "with_thread_switches",
]
