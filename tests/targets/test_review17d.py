"""review17d: the run17 leaner run path restores the caller's thread count after an observer
changed it (the lean scope exit skipped its read-back when no step switches)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu import target  # noqa: E402
from tests.targets.test_run17_lean_run import _mlp  # noqa: E402


def test_observer_thread_switch_is_undone() -> None:
    prog = pygraphx.parse_onnx_buffer(_mlp()[0])
    prog.compile(target.CpuTarget(threads=2, step_threads=False))  # no step switches
    assert not prog._executable.scope.switches
    caller = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # the run's own count: the enter sets nothing
        prog.run(
            {"x": np.zeros((4, 32), np.float32)},
            observer=lambda ins, value, seconds: torch.set_num_threads(1),
        )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(caller)
