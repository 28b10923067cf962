"""The target protocol: what `get_target(name)` returns and what `Program.compile` calls.

A target names its ordered pass list and turns a (rewritten) program into an `Executable` whose
`run(params)` maps parameter arrays to output arrays; `compile(program, options)` does both.
`fusion_policy()` tells the fusion passes what the target can run as one group. Targets import
the IR, never each other. The IR reaches targets by name through `pygraphx.ir.registry`, where
`pygraphx.targets` registers them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pygraphx.ir.mapped import check_program
from pygraphx.ir.registry import Executable
from pygraphx.passes.fusion_policy import DefaultFusion, FusionPolicy
from pygraphx.passes.manager import run_passes
from pygraphx.passes.pipeline import already_optimized

if TYPE_CHECKING:
    from pygraphx.ir.program import Program


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

    def compile(self, program: Program, options: dict[str, Any]) -> Executable:
        """Run this target's passes on `program` (their times go to `program.pass_times`),
        then make the executable: what `Program.compile` calls. Passes that `optimize()`
        already ran on the unchanged program (`-O`) are not run again."""
        check_program(program, "compiling")  # its weights may be views of a model file
        passes = self.get_passes(options)
        if not already_optimized(program, passes, self.fusion_policy()):  # -O, then compile
            program.pass_times = run_passes(program, passes)
        return self.prepare(program, options)

    def __repr__(self) -> str:
        return f"target({self.name!r})"


__all__ = ["Executable", "Target"]
