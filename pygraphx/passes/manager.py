"""The pass manager: runs a target's explicit, ordered pass list over every module of a program.

After each pass every module is validated, so a pass that breaks the IR is named at once.
Environment switches: `PGX_TRACE_COMPILE=1` prints the program after every pass,
`PGX_TIME_PASSES=1` prints each pass's time, `PGX_DISABLE_PASSES=a,b` skips passes by name.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pygraphx.ir.mapped import check_program
from pygraphx.ir.module import Module, ModuleError

if TYPE_CHECKING:
    from pygraphx.ir.program import Program


class PassError(RuntimeError):
    """A pass left a module invalid; the message names the pass and the instruction."""


@dataclass(frozen=True)
class Pass:
    """A named rewrite of one module (`fn(module, program)`)."""

    name: str
    fn: Callable[[Module, Program], None]

    def __call__(self, module: Module, program: Program) -> None:
        self.fn(module, program)


def module_pass(fn: Callable[[Module], None]) -> Pass:
    """A pass from a function of the module alone, named after the function."""
    return Pass(fn.__name__, lambda module, program: fn(module))


def _flag(name: str) -> str:
    return os.environ.get(name, "").strip()


def disabled_passes() -> set[str]:
    return {p.strip() for p in _flag("PGX_DISABLE_PASSES").split(",") if p.strip()}


#: `listener(index, count, pass name)` is called before each pass runs (progress bars)
PASS_LISTENERS: list[Callable[[int, int, str], None]] = []


@contextmanager
def listen_passes(listener: Callable[[int, int, str], None]) -> Iterator[None]:
    """Call `listener` before every pass that runs while the context is open."""
    PASS_LISTENERS.append(listener)
    try:
        yield
    finally:
        PASS_LISTENERS.remove(listener)


def run_passes(
    program: Program, passes: Sequence[Pass], *, validate: bool = True
) -> list[tuple[str, float]]:
    """Apply `passes` in order to every module; returns (pass name, seconds) per pass run."""
    trace = _flag("PGX_TRACE_COMPILE") not in ("", "0")
    timing = _flag("PGX_TIME_PASSES") not in ("", "0")
    skip = disabled_passes()
    check_program(program, "optimizing")  # passes read weights that may be views of a file
    times: list[tuple[str, float]] = []
    for k, p in enumerate(passes):
        for listener in PASS_LISTENERS:
            listener(k, len(passes), p.name)
        if p.name in skip:
            if trace or timing:
                print(f"Pass: {p.name} (disabled by PGX_DISABLE_PASSES)", file=sys.stderr)
            continue
        start = time.perf_counter()
        for mod in list(program.modules.values()):
            p(mod, program)
        elapsed = time.perf_counter() - start
        times.append((p.name, elapsed))
        if validate:
            for mod in program.modules.values():
                try:
                    mod.validate()
                except ModuleError as exc:
                    raise PassError(f"pass {p.name!r} left the program invalid: {exc}") from exc
        if timing:
            print(f"Pass: {p.name}: {elapsed * 1e3:.3f}ms", file=sys.stderr)
        if trace:
            print(f"Pass: {p.name}\n{program}", file=sys.stderr)
    if timing:
        total = sum(t for _, t in times)
        print(f"Passes total: {total * 1e3:.3f}ms", file=sys.stderr)
    return times
