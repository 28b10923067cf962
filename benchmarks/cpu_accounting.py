"""Each engine's own CPU time, in a benchmark process that runs several engines (issue 10).

The process CPU time of a run (`time.process_time`) counts every thread of the process: in a
process that also holds ONNX Runtime or OpenVINO, it carries their thread pools still spinning
after their own runs (session 7's `cpu_vs_peers.py` printed MobileNetV2 b8 at 391 CPU ms a run
at 9.9 ms latency on 16 cores, more than 16 cores can give). This module counts, per thread,
the CPU nanoseconds the kernel keeps for it (/proc/self/task/TID/schedstat) and gives each
engine the threads that are its own:

- an engine with its own pool (ONNX Runtime's intra-op threads, OpenVINO's executor / TBB
  threads) owns the threads that appeared while it was created and first run
  (`ThreadLedger.pool`); engines that share a runtime share one pool (two ORT sessions both
  "ort", OpenVINO's f32 and default models both "openvino"), and its pool plus the calling
  thread (which waits or works in its run) are its own;
- an engine that runs on the calling thread's team (pygraphx, torch eager: GNU OpenMP's workers
  belong to the calling thread) owns every thread that no pool claimed, the caller included.

`ThreadLedger.start` / `stop` around a window of runs (after the warm-up) give the window's own
CPU ms and the "others'" CPU ms: what the other engines' threads burned meanwhile (a neighbour's
pool still spinning). The two add up to the process CPU of the window. The counters are read
one thread after another (some microseconds each; the caller's own clock is read last when a
window opens and first when it closes, so the reading is not the caller's work): a pool that
spins while they are read adds that much to its engine's figures.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

#: the pool of engines that run on the calling thread's team (pygraphx, torch eager)
CALLER = "caller"


def _read_thread_ns(tid: int) -> int | None:
    """CPU nanoseconds thread `tid` of this process has run (its schedstat; its stat's clock
    ticks where schedstat is missing), None when it has ended."""
    base = f"/proc/self/task/{tid}"
    try:
        with open(f"{base}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"{base}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None  # the thread ended meanwhile
    ticks = int(fields[11]) + int(fields[12])
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def thread_ids() -> set[int]:
    """The OS thread ids of this process now."""
    return {int(t) for t in os.listdir("/proc/self/task")}


def thread_cpu_ns(caller_first: bool = False) -> dict[int, int]:
    """CPU nanoseconds each thread of this process has run. The calling thread's own counter
    is read last (default: a snapshot before a window, so that the reading itself falls
    outside it) or, with `caller_first`, first (a snapshot after a window)."""
    caller = threading.get_native_id()
    out: dict[int, int] = {}
    if caller_first:
        out[caller] = time.thread_time_ns()
    for tid in thread_ids() - {caller}:
        ns = _read_thread_ns(tid)
        if ns is not None:
            out[tid] = ns
    if not caller_first:
        out[caller] = time.thread_time_ns()
    return out


def thread_names(tids: set[int]) -> list[str]:
    """The kernel's names (comm) of `tids` that are alive, sorted."""
    names = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    return sorted(names)


@dataclass
class ThreadLedger:
    """Which OS threads are which engine's (see the module docstring)."""

    #: pool name -> the threads it started
    pools: dict[str, set[int]] = field(default_factory=dict)
    #: engine name -> its pool's name (`CALLER` where it was never given one)
    engines: dict[str, str] = field(default_factory=dict)
    caller: int = field(default_factory=threading.get_native_id)
    #: the threads alive when the engines were all made (`seal`)
    sealed: set[int] = field(default_factory=set)

    @contextmanager
    def pool(self, engine: str, pool: str) -> Iterator[None]:
        """The threads that start inside the `with` (create the engine and run it once there:
        some runtimes start their pool at the first run) are `pool`'s, and `engine` runs on
        it. Run the caller-side engines once before, so GNU OpenMP's workers exist."""
        seen = thread_ids()
        yield
        self.pools.setdefault(pool, set()).update(thread_ids() - seen)
        self.engines[engine] = pool

    def seal(self) -> None:
        """Mark the engines made: a thread that starts later is the caller side's, and
        `describe` counts it (a runtime that starts threads after its first run would be
        miscounted, so the report says so)."""
        self.sealed = thread_ids()

    def pool_of(self, engine: str) -> str:
        return self.engines.get(engine, CALLER)

    def owned(self, engine: str, tids: set[int]) -> set[int]:
        """Which of `tids` count for `engine`: every thread no other engine's pool claimed.
        For a caller-side engine that is the caller and GNU OpenMP's workers; for a pool
        engine its pool, the caller and those workers too, which a runtime sharing the
        process's OpenMP runs on (OpenVINO's CPU plugin beside torch: counting only its pool
        gave it one thread's CPU at 2 threads, its second thread's in `others_ms`); only one
        engine runs at a time, so the workers' time in its window is its work (or their
        bounded spin after the caller side's last run)."""
        pool = self.pool_of(engine)
        others = [tids_ for name, tids_ in self.pools.items() if name != pool]
        return tids - set().union(*others) if others else set(tids)

    def split(self, before: dict[int, int], after: dict[int, int], engine: str) -> Window:
        """The CPU ms between two snapshots, `engine`'s own and the other threads'."""
        delta = {t: ns - before.get(t, 0) for t, ns in after.items()}
        mine = self.owned(engine, set(delta))
        own = sum(delta[t] for t in mine)
        return Window(own / 1e6, (sum(delta.values()) - own) / 1e6)

    def start(self) -> dict[int, int]:
        """A snapshot opening a window (the caller's counter read last)."""
        return thread_cpu_ns()

    def stop(self, before: dict[int, int], engine: str) -> Window:
        """Close the window `before` opened: its CPU ms, `engine`'s own and the others'."""
        return self.split(before, thread_cpu_ns(caller_first=True), engine)

    def describe(self) -> str:
        """The pools and their threads' names, for a report's header."""
        parts = []
        for pool, tids in self.pools.items():
            names = thread_names(tids)
            shown = ", ".join(sorted(set(names)))
            parts.append(f"{pool}: {len(tids)} threads ({shown or 'ended'})")
        if self.sealed:
            late = thread_ids() - self.sealed
            parts.append(f"{len(late)} threads started since ({', '.join(thread_names(late))})")
        return "; ".join(parts) or "no engine pools"


@dataclass(frozen=True)
class Window:
    """CPU ms of a window of runs: the engine's own threads, and every other thread."""

    own_ms: float
    others_ms: float

    def per_run(self, runs: int) -> Window:
        return Window(self.own_ms / runs, self.others_ms / runs)


def timed_block(
    ledger: ThreadLedger, engine: str, fn: Callable[[], object], runs: int
) -> tuple[list[float], list[float], Window]:
    """Run `fn` `runs` times (after the caller's warm-up): the wall and process-CPU seconds of
    each run and the block's CPU ms per run (`engine`'s own and the others')."""
    walls: list[float] = []
    cpus: list[float] = []
    before = ledger.start()
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - start_cpu)
    return walls, cpus, ledger.stop(before, engine).per_run(runs)


__all__ = [
    "CALLER",
    "ThreadLedger",
    "Window",
    "thread_cpu_ns",
    "thread_ids",
    "thread_names",
    "timed_block",
]
