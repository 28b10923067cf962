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


def _counting_sets(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = torch.set_num_threads

    def counting(n: int) -> None:
        calls.append(n)
        real(n)

    monkeypatch.setattr(torch, "set_num_threads", counting)
    return calls


@pytest.mark.parametrize("skip", [True, False])
def test_run_sets_the_thread_count_only_where_it_changes(
    monkeypatch: pytest.MonkeyPatch, skip: bool
) -> None:
    """mnv16 (`SKIP_SAME_COUNT`): a run whose steps all take the caller's count sets nothing;
    a step of another count is switched to and the caller's count comes back at the exit; the
    caller's count unlike the run's is set at the enter and restored. Off: every time."""
    monkeypatch.delenv(LOAD_ADAPT_ENV, raising=False)
    monkeypatch.setattr(scheduling.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(scheduling, "SKIP_SAME_COUNT", skip)
    caller = torch.get_num_threads()
    seen: list[int] = []

    def record() -> None:
        seen.append(torch.get_num_threads())

    try:
        torch.set_num_threads(2)
        scope = RunScope(2, stall=False)
        same = scheduling.with_thread_switches([record] * 3, [2, 2, 2], scope.limit, 2)
        mixed = scheduling.with_thread_switches([record] * 3, [2, 1, 2], scope.limit, 2)
        ends_low = scheduling.with_thread_switches([record] * 2, [2, 1], scope.limit, 2)
        assert (same[0] is record) == skip
        calls = _counting_sets(monkeypatch)
        with scope():
            for fn in same:
                fn()
        assert seen == [2, 2, 2] and torch.get_num_threads() == 2
        assert calls == ([] if skip else [2, 2, 2])
        for fns, want in ((mixed, [2, 1, 2]), (ends_low, [2, 1])):
            seen.clear()
            calls.clear()
            with scope():
                for fn in fns:
                    fn()
            assert seen == want and torch.get_num_threads() == 2
            assert calls[-1] == 2 and 1 in calls
        torch.set_num_threads(3)  # the caller's count is not the run's: set, then restored
        seen.clear()
        calls.clear()
        with scope():
            for fn in same:
                fn()
        assert seen == [2, 2, 2] and torch.get_num_threads() == 3
        assert calls[0] == 2 and calls[-1] == 3
    finally:
        monkeypatch.undo()
        torch.set_num_threads(caller)
