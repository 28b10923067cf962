"""The cpu target's run scope on a busy machine: a run takes fewer threads when other
processes keep the CPUs busy (`scheduling.load_threads`), says so once, and gives the caller's
thread count back."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from pygraphx.targets.cpu import scheduling  # noqa: E402
from pygraphx.targets.cpu.scheduling import LOAD_ADAPT_ENV, RunScope, load_threads  # noqa: E402


@pytest.mark.parametrize(
    ("n", "load", "cpus", "want"),
    [
        (2, 0.4, 2, 2),  # idle machine
        (2, 2.3, 2, 2),  # the load is this run's own threads
        (2, 2.9, 2, 2),  # others keep less than one CPU busy
        (2, 3.0, 2, 1),  # one busy neighbour on two CPUs: one CPU left
        (2, 12.0, 2, 1),  # far more work than CPUs: at least one thread
        (4, 14.5, 16, 4),  # 10.5 CPUs busy elsewhere, 5.5 left: all four
        (4, 17.0, 16, 3),  # 13 busy elsewhere: three left
        (1, 50.0, 2, 1),
    ],
)
def test_load_threads(n: int, load: float, cpus: int, want: int) -> None:
    assert load_threads(n, load, cpus) == want


def test_load_adaptation_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOAD_ADAPT_ENV, "0")
    assert load_threads(2, 12.0, 2) == 2


def test_no_load_average_keeps_every_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the platform has no load average (Windows), a run keeps its threads."""
    monkeypatch.delenv(LOAD_ADAPT_ENV, raising=False)
    monkeypatch.delattr(scheduling.os, "getloadavg")
    assert load_threads(4) == 4


def test_busy_machine_runs_on_fewer_threads_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(LOAD_ADAPT_ENV, raising=False)
    monkeypatch.setattr(scheduling.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(scheduling.os, "getloadavg", lambda: (12.0, 12.0, 12.0))
    caller = torch.get_num_threads()
    scope = RunScope(2)
    with caplog.at_level(logging.INFO, logger="pygraphx.cpu"):
        for _ in range(2):
            with scope():
                assert torch.get_num_threads() == 1
                assert scope.limit[0] == 1
            assert torch.get_num_threads() == caller
    told = [r for r in caplog.records if "machine is busy" in r.getMessage()]
    assert len(told) == 1 and "1 of 2 threads" in told[0].getMessage()
    monkeypatch.setattr(scheduling.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    with scope():  # the load is read again only after LOAD_CHECK_S (the kernel's is 5 s)
        assert torch.get_num_threads() == 1
    scope._check_at = scope._clock()  # (its time has come)
    with scope():
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == caller
