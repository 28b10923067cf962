"""Progress on stderr for the driver's long steps: a bar on a terminal, nothing when piped.

`compile_progress` shows one bar step per compiler pass (the pass manager calls a listener
before each pass) and then the step's time, as `Steps` does for the others; when stderr is not a
terminal it is `Steps`' plain timing line alone, so logs and pipes stay clean.
`sample_progress` does the same for a loop over samples (`--int8` / `--fp8` calibration): one
bar step per sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pygraphx.driver.steps import Steps, format_seconds
from pygraphx.ir.program import Program
from pygraphx.passes.manager import listen_passes

T = TypeVar("T")


@contextmanager
def _timed_bar(steps: Steps, label: str, note: str = "") -> Iterator[Progress]:
    """A transient bar on `steps`' console, then the step's time (as `Steps` prints it)."""
    start = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=steps.console, transient=True) as bar:
        yield bar
    elapsed = time.perf_counter() - start
    steps.times[label] = elapsed
    text = f"{label}: {format_seconds(elapsed)}{note}"
    steps.console.print(text, style="dim", highlight=False)


@contextmanager
def compile_progress(steps: Steps, label: str, program: Program) -> Iterator[None]:
    """`steps(label)`, with a bar of the compiler's passes on a terminal."""
    if not steps.console.is_terminal:
        with steps(label):
            yield
        return
    with _timed_bar(steps, label) as bar:
        task = bar.add_task(label, total=None)

        def on_pass(index: int, count: int, name: str) -> None:
            bar.update(
                task, total=count, completed=index, description=f"{label}: {name}", refresh=True
            )

        with listen_passes(on_pass):
            yield
        total = bar.tasks[0].total
        bar.update(task, completed=total, description=label)


class _Advancing(Sequence[T]):
    """`items`, calling `advance(k)` once the consumer is done with item k (when it asks for
    the next one, or stops)."""

    def __init__(self, items: Sequence[T], advance: Callable[[int], None]) -> None:
        self.items, self.advance = items, advance

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: Any) -> Any:
        return self.items[index]

    def __iter__(self) -> Iterator[T]:
        for k, item in enumerate(self.items):
            yield item
            self.advance(k + 1)


@contextmanager
def sample_progress(steps: Steps, label: str, samples: Sequence[T]) -> Iterator[Sequence[T]]:
    """`steps(label)` around a loop over `samples` (calibration): on a terminal, a bar that
    advances per sample; yields the sequence to loop over."""
    if not steps.console.is_terminal:
        with steps(label):
            yield samples
        return
    with _timed_bar(steps, label, f" ({len(samples)} samples)") as bar:
        task = bar.add_task(f"{label} (samples)", total=len(samples))
        yield _Advancing(samples, lambda done: bar.update(task, completed=done, refresh=True))
