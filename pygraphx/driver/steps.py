"""`Steps`: the driver's long steps on stderr (a spinner while one runs, then its time)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

#: `step(label)` -> a context manager around one long step (progress and timing).
StepFn = Callable[[str], AbstractContextManager[Any]]


def format_seconds(seconds: float) -> str:
    """`0.0123` -> `12.3 ms`, `2.5` -> `2.50 s`."""
    if seconds < 1.0:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.2f} s"


@dataclass
class Steps:
    """Shows a spinner on stderr while a long step runs, then its time (`parse: 1.20 s`)."""

    console: Console
    times: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        with self.console.status(f"{label} ...", spinner="dots"):
            yield
        elapsed = time.perf_counter() - start
        self.times[label] = elapsed
        self.console.print(f"{label}: {format_seconds(elapsed)}", style="dim", highlight=False)
