"""What the IR needs from the layers above it, registered by them at import time.

The IR is the bottom layer: it never imports passes, runtime or targets. `Program.compile`,
`Program.get_memory_usage` and `load` still need a target by name and the memory planner, so
those layers register themselves here (`pygraphx.targets` registers `ref` and `cpu`,
`pygraphx.passes.memory_coloring` the planner) and the IR looks them up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from pygraphx.ir.module import Module


class Executable(Protocol):
    """A compiled program. `observer(ins, value, seconds)`, when given, is called after each
    instruction of `main` (instructions are the program's, so profiles print like the program).
    """

    def run(
        self, params: dict[str, np.ndarray], observer: Callable[..., None] | None = None
    ) -> list[np.ndarray]: ...


class CompileTarget(Protocol):
    """What `Program.compile` and `load` ask of a target (`pygraphx.targets.base.Target`).
    `program` is a `Program` (typed `Any`: `ir.program` imports this module)."""

    name: str

    def compile(self, program: Any, options: dict[str, Any]) -> Executable:
        """Run the target's passes on `program`, then make its executable."""
        ...

    def prepare(self, program: Any, options: dict[str, Any]) -> Executable:
        """Make an executable from a program the passes have already rewritten."""
        ...


class MemoryPlan(Protocol):
    arena_bytes: int


_TARGETS: dict[str, Callable[[], CompileTarget]] = {}
_MEMORY_PLANNER: list[Callable[[Module], MemoryPlan]] = []


def register_target(name: str, factory: Callable[[], CompileTarget]) -> None:
    """Make `get_target(name)` call `factory()` (a new target object per call)."""
    _TARGETS[name] = factory


def target_names() -> tuple[str, ...]:
    """The registered target names, in registration order."""
    return tuple(_TARGETS)


def get_target(name: str) -> CompileTarget:
    """The target called `name`; an unknown name lists the registered ones."""
    try:
        factory = _TARGETS[name]
    except KeyError:
        known = ", ".join(_TARGETS) or "none (import pygraphx.targets to register them)"
        raise ValueError(f"unknown target {name!r}; available targets: {known}") from None
    return factory()


def register_memory_planner(planner: Callable[[Module], MemoryPlan]) -> None:
    """The function that plans a module's scratch arena (`passes.memory_coloring.plan_memory`)."""
    _MEMORY_PLANNER[:] = [planner]


def plan_memory(module: Module) -> MemoryPlan:
    """The module's memory plan, from the registered planner."""
    if not _MEMORY_PLANNER:
        raise RuntimeError(
            "no memory planner is registered: import pygraphx.passes.memory_coloring first"
        )
    return _MEMORY_PLANNER[0](module)
