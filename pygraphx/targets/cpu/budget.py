"""The process-wide thread budget of the `cpu` target: the threads shared by the runs in
flight in one process (the policy is `threads.py`'s module docstring; `threads.BUDGET` is the
process's instance, `scheduling.RunScope` takes and gives back its threads)."""

from __future__ import annotations

import threading


class ThreadBudget:
    """Threads shared by the runs in flight in this process (the policy: `threads.py`)."""

    def __init__(self, total: int) -> None:
        self.total = max(1, total)
        self.free = self.total
        self.holders = 0
        self.waiting = 0  # runs waiting in `acquire` for threads
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._local = threading.local()

    def acquire(self, want: int) -> int:
        """Take up to `want` threads, waiting while none is free; returns how many."""
        held = getattr(self._local, "held", 0)
        if held:  # a run inside a run on this thread: it uses the outer run's threads
            self._local.depth += 1
            return min(want, held)
        with self._lock:  # (the condition's)
            while self.holders and self.free <= 0:
                self.waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self.waiting -= 1
            if self.holders:
                share = max(1, self.total // (self.holders + 1))
                got = max(1, min(want, self.free, share))
            else:
                got = want  # alone: what was asked, even beyond the pool
            self.free -= got
            self.holders += 1
        self._local.held, self._local.depth = got, 1
        return got

    def release(self) -> None:
        """Give back what this thread's `acquire` took."""
        self._local.depth -= 1
        if self._local.depth:
            return
        got, self._local.held = self._local.held, 0
        # the condition's lock, notified only when a run waits (Condition's Python cost 11-14
        # us a run, cold after the steps: MobileNetV2 b1, 2 threads)
        with self._lock:
            self.free += got
            self.holders -= 1
            if self.waiting:
                self._cond.notify_all()


__all__ = ["ThreadBudget"]
