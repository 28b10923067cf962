"""What the numpy fallback costs, said once per program: the first run times the steps that run
an operator's numpy code (`Step.fallback`, see `torch_lowering/fallback.py`) and the whole run,
and warns "<target> target: numpy fallback: N instruction(s) took X ms of Y ms (Z%) of this
run" (the cpu target and the gpu target's uncaptured runs; a device is synchronised around the
timed steps so their time is theirs).

Only the first run pays for it (a timed copy of the step list, used once); later runs use the
plain steps, so no clock is read per step after that. `perf` times every step as before.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence

Fn = Callable[[], None]


class FallbackTimer:
    """Sums the time of the wrapped steps; `timed(fn)` wraps one."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, fn: Fn) -> Fn:
        clock = time.perf_counter

        def step() -> None:
            start = clock()
            try:
                fn()
            finally:
                self.seconds += clock() - start

        return step


def timed_steps(
    fns: Sequence[Fn], fallback: Sequence[bool], sync: Fn | None = None
) -> tuple[list[Fn], FallbackTimer]:
    """`fns` with the fallback steps wrapped by one timer (the others unchanged); with `sync`
    (a device synchronisation) the work queued before a fallback step finishes before its clock
    starts, and its own device work before the clock stops."""
    timer = FallbackTimer()
    if sync is None:
        out = [timer.timed(fn) if fb else fn for fn, fb in zip(fns, fallback, strict=True)]
        return out, timer
    out = [_synced(fn, sync, timer) if fb else fn for fn, fb in zip(fns, fallback, strict=True)]
    return out, timer


def _synced(fn: Fn, sync: Fn, timer: FallbackTimer) -> Fn:
    def body() -> None:
        fn()
        sync()

    timed = timer.timed(body)

    def step() -> None:
        sync()
        timed()

    return step


def cost_message(instructions: int, fallback_s: float, total_s: float, target: str = "cpu") -> str:
    """The sentence the first run warns with."""
    share = 100.0 * fallback_s / total_s if total_s > 0 else 0.0
    return (
        f"{target} target: numpy fallback: {instructions} instruction(s) took "
        f"{fallback_s * 1e3:.3g} ms of {total_s * 1e3:.3g} ms ({share:.0f}%) of this run"
    )


def announce_cost(
    instructions: int, fallback_s: float, total_s: float, target: str = "cpu"
) -> None:
    """Warn once (the caller calls this after its first run only) with `cost_message`."""
    message = cost_message(instructions, fallback_s, total_s, target)
    warnings.warn(message, RuntimeWarning, stacklevel=5)


__all__ = ["FallbackTimer", "announce_cost", "cost_message", "timed_steps"]
