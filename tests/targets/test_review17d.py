"""review17d: reproductions for the run17 leaner run path (xfail(strict=True) until mended)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu import target  # noqa: E402
from tests.targets.test_run17_lean_run import _mlp  # noqa: E402


@pytest.mark.xfail(
    strict=True,
    reason="review17d: LEAN_SCOPE skips the exit's read-back when no step switches and the "
    "enter set nothing, so a profiled run's observer that changes torch's count is not undone",
)
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
