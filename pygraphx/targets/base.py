"""The target protocol: what `get_target(name)` returns and what `Program.compile` calls.

A target names its ordered pass list and turns a (rewritten) program into an `Executable` whose
`run(params)` maps parameter arrays to output arrays; `fusion_policy()` tells the fusion passes what
the target can run as one group. Targets import the IR, never each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pygraphx.passes.fusion_policy import DefaultFusion, FusionPolicy

if TYPE_CHECKING:
    from pygraphx.ir.program import Program


class Executable(Protocol):
    """A compiled program. `observer(ins, value, seconds)`, when given, is called after each
    instruction of `main` (instructions are the program's, so profiles print like the program).
    """

    def run(
        self, params: dict[str, np.ndarray], observer: Callable[..., None] | None = None
    ) -> list[np.ndarray]: ...


class Target:
    """Base class of targets."""

    name = ""

    def fusion_policy(self) -> FusionPolicy:
        """What this target lets the fusion passes group (`passes/fusion_policy.py`): the
        default is the CPU's `DefaultFusion`; a code-generating target returns `RowFusion`."""
        return DefaultFusion()

    def get_passes(self, options: dict[str, Any]) -> list:
        """The ordered pass list this target runs at compile time."""
        return []

    def prepare(self, program: Program, options: dict[str, Any]) -> Executable:
        """Make an executable from a program the passes have already rewritten."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"target({self.name!r})"
