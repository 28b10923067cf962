"""Device time of kernel launches with no host time in it, for the generated kernels' autotune.

A generated group kernel runs for a few microseconds, while launching it from Python takes
about as long or longer: timing launches one after another between CUDA events measures the
host's launch rate, not the kernel, and the choice between launch configurations becomes
noise (the same layer-norm kernel was measured at 9 and at 18 us in two processes). Here the
device is first kept busy by a spin kernel (`torch.cuda._sleep`) while the host queues every
launch, so the launches then run back to back and each batch of `reps` launches of one
configuration is timed between two events. The candidates take turns over several `rounds`
(a clock or cache change hits each alike) and each one's time is the median of its rounds.
When the host took longer to queue than the device spun (a slow host), the spin is lengthened
and the measurement repeated.

`pick` then takes the fastest, except that a candidate within `TIE` of it that comes earlier
in the list (the default first) wins: candidates that time alike are not chosen by noise.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

T = TypeVar("T")

#: launches of one configuration between two events
REPS = 10
#: turns every candidate takes
ROUNDS = 5
#: a candidate at most this fraction slower than the fastest counts as tied with it
TIE = 0.03
#: spin cycles to start with (~10 ms at 2 GHz); adapted to the host's queueing time
_spin = {"cycles": 20_000_000}
_MAX_CYCLES = 4_000_000_000
_TRIES = 3


def time_candidates(
    runs: Sequence[Callable[[], None]], reps: int = REPS, rounds: int = ROUNDS
) -> list[float]:
    """Device milliseconds of one call of each of `runs` (each launches one kernel on the
    current CUDA stream), measured as the module docstring says, after one call of each
    (which compiles)."""
    for run in runs:
        run()
    torch.cuda.synchronize()
    for _ in range(_TRIES):
        per_run, host, spun = _timed_rounds(runs, reps, rounds, _spin["cycles"])
        if host < 0.9 * spun or _spin["cycles"] >= _MAX_CYCLES:
            break
        grown = int(_spin["cycles"] * 2.0 * host / max(spun, 1e-6))
        _spin["cycles"] = min(max(grown, 2 * _spin["cycles"]), _MAX_CYCLES)
    return [statistics.median(t) for t in per_run]


def _timed_rounds(
    runs: Sequence[Callable[[], None]], reps: int, rounds: int, cycles: int
) -> tuple[list[list[float]], float, float]:
    """(ms a call of each run, one entry a round; host seconds spent queueing; seconds the
    device spun ahead of them)."""

    def event() -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    spin = (event(), event())
    spin[0].record()
    torch.cuda._sleep(cycles)
    spin[1].record()
    marks: list[list[tuple[torch.cuda.Event, torch.cuda.Event]]] = [[] for _ in runs]
    start = time.perf_counter()
    for _ in range(rounds):
        for k, run in enumerate(runs):
            pair = (event(), event())
            pair[0].record()
            for _ in range(reps):
                run()
            pair[1].record()
            marks[k].append(pair)
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    per_run = [[a.elapsed_time(b) / reps for a, b in pairs] for pairs in marks]
    return per_run, host, spin[0].elapsed_time(spin[1]) / 1e3


def pick(times: Sequence[float], options: Sequence[T], tie: float = TIE) -> T:
    """The first of `options` whose time is within `tie` of the fastest (`times[k]` is
    `options[k]`'s)."""
    if len(times) != len(options) or not options:
        raise ValueError(f"{len(times)} times for {len(options)} options")
    limit = min(times) * (1.0 + tie)
    return next(o for t, o in zip(times, options, strict=True) if t <= limit)


__all__ = ["REPS", "ROUNDS", "TIE", "pick", "time_candidates"]
