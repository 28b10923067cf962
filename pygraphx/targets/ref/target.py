"""The `ref` target: runs the program as parsed, through each operator's numpy `compute()`.

It applies no rewrites (its pass list is empty), so it is the oracle every other target and
every pass is checked against. Preparing validates the program and builds the evaluator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pygraphx.ir.mapped import detach_program
from pygraphx.runtime.evaluator import Evaluator, Observer
from pygraphx.targets.base import Target

if TYPE_CHECKING:
    from pygraphx.ir.program import Program


class RefExecutable:
    # every run keeps its values in a dict of its own: runs from several threads need no lock
    reentrant = True

    def __init__(self, program: Program) -> None:
        self.evaluator = Evaluator(program.get_main_module())

    def run(
        self, params: dict[str, np.ndarray], observer: Observer | None = None
    ) -> list[np.ndarray]:
        return self.evaluator.run(params, observer=observer)


class RefTarget(Target):
    name = "ref"

    def prepare(self, program: Program, options: dict[str, Any]) -> RefExecutable:
        program.validate()
        detach_program(program)  # runs read the weights: out of a file that may be rewritten
        return RefExecutable(program)
