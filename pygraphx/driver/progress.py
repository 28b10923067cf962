"""Progress on stderr for the driver's long steps: a bar on a terminal, nothing when piped.

`compile_progress` shows one bar step per compiler pass (the pass manager calls a listener
before each pass) and then the step's time, as `Steps` does for the others; when stderr is not a
terminal it is `Steps`' plain timing line alone, so logs and pipes stay clean.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pygraphx.driver.steps import Steps, format_seconds
from pygraphx.ir.program import Program
from pygraphx.passes.manager import listen_passes


@contextmanager
def compile_progress(steps: Steps, label: str, program: Program) -> Iterator[None]:
    """`steps(label)`, with a bar of the compiler's passes on a terminal."""
    if not steps.console.is_terminal:
        with steps(label):
            yield
        return
    start = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=steps.console, transient=True) as bar:
        task = bar.add_task(label, total=None)

        def on_pass(index: int, count: int, name: str) -> None:
            bar.update(
                task, total=count, completed=index, description=f"{label}: {name}", refresh=True
            )

        with listen_passes(on_pass):
            yield
        total = bar.tasks[0].total
        bar.update(task, completed=total, description=label)
    elapsed = time.perf_counter() - start
    steps.times[label] = elapsed
    steps.console.print(f"{label}: {format_seconds(elapsed)}", style="dim", highlight=False)
