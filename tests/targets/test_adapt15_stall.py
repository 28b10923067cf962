"""The cpu target's stall adaptation (`threads.StallAdapt`, applied by `scheduling.RunScope`):
runs much slower than the program's best at their thread count, several in a row, lower the
count; a probe of the full count gives it back once the stall is gone; noise moves nothing;
concurrent use is safe; and end to end, a program beside real spinning processes comes down to
fewer threads and back."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable

import numpy as np
import pytest
from onnx import helper

from pygraphx.targets.cpu import threads
from pygraphx.targets.cpu.threads import (
    STALL_ADAPT_ENV,
    STALL_BEST_AFTER,
    STALL_DOWN_SPACING_RUNS,
    STALL_PROBE_RUNS,
    STALL_HOLD_S,
    STALL_RUNS,
    StallAdapt,
)

MS = 1e-3
#: the span a stall's slow runs must fill before the count comes down (0.25 s); the logic
#: tests below run 10 ms programs and use 20 ms (what it was when they were written), the
#: span's own tests the real one
REAL_SPAN = threads.STALL_MIN_SPAN_S


@pytest.fixture(autouse=True)
def _short_span(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "STALL_MIN_SPAN_S", 0.02)


class Feed:
    """Runs fed to a controller on a synthetic clock (each run ends `seconds` after the last)."""

    def __init__(self, n: int) -> None:
        self.now = 0.0
        self.c = StallAdapt(n, clock=lambda: self.now)
        self.used: list[int] = []

    def run(
        self, seconds_at: dict[int, float] | Callable[[int], float] | float, times: int = 1
    ) -> list[str | None]:
        """`times` runs, each taking `seconds_at` (a time, or one per count: a dict, or a
        function of the count)."""
        events = []
        for _ in range(times):
            used = self.c.want(self.now)
            self.used.append(used)
            if isinstance(seconds_at, float):
                t = seconds_at
            elif isinstance(seconds_at, dict):
                t = seconds_at[used]
            else:
                t = seconds_at(used)
            self.now += t
            events.append(self.c.record(used, t, self.now))
        return events


def quiet(n: int = 2, ms: float = 10.0, runs: int = 10) -> Feed:
    f = Feed(n)
    f.run(ms * MS, runs)
    return f


@pytest.mark.parametrize(("n", "lowered"), [(2, 1), (16, 8), (3, 1)])
def test_a_stall_lowers_the_count(n: int, lowered: int) -> None:
    f = quiet(n)
    events = f.run(30 * MS, STALL_RUNS)
    assert events[-1] == "lowered" and events[:-1] == [None] * (STALL_RUNS - 1)
    assert f.c.count == lowered and f.c.want(f.now) == lowered
    assert f.c.last_stall == pytest.approx(30 * MS)


def test_a_stall_that_goes_on_lowers_it_again() -> None:
    f = quiet(16)
    f.run(30 * MS, STALL_RUNS)
    assert f.c.count == 8
    f.run({8: 12 * MS}, STALL_BEST_AFTER + 1)  # the lowered count's best (no probe due yet)
    f.run({8: 25 * MS}, STALL_RUNS)  # slow, yet faster than 16 stalled
    assert f.c.count == 4


def test_a_lowered_count_stalled_from_its_first_run_is_lowered_again() -> None:
    """The lowered count has no quiet best: the full count's best, scaled, stands for it."""
    f = quiet(16, ms=10.0)
    f.run(100 * MS, STALL_RUNS)
    assert f.c.count == 8
    f.run({8: 60 * MS}, STALL_RUNS)  # > 1.6 x 10 ms x 16 / 8, < 100 ms
    assert f.c.count == 4
    # 4 threads at 30 ms (1.5 x 10 x 16 / 4 is no stall); more threads stall (probes fail)
    f.run(lambda c: 30 * MS if c <= 4 else 100 * MS, 20)
    assert f.c.count == 4


def test_a_program_stalled_from_its_first_run_finds_fewer_threads_faster() -> None:
    """Busy from the start: its best is a stalled run, so only trying half the threads shows
    the stall; the tries back off while half is no faster."""
    f = quiet(16, ms=60.0)  # stalled from the first run
    f.run(lambda c: 20 * MS if c <= 8 else 60 * MS, 40)  # 2.4 s: 600 runs are 36 s
    assert f.c.down_probes == 0
    f.run(lambda c: 20 * MS if c <= 8 else 60 * MS, STALL_DOWN_SPACING_RUNS)
    assert f.c.down_probes == 1 and f.c.lowered == 1 and f.c.count >= 8
    g = quiet(16, ms=10.0)  # quiet: half the threads are slower
    g.run(lambda c: 10 * MS * 16 / c if c < 16 else 10 * MS, 6000)  # 60 s
    assert g.c.changes == 0 and 1 <= g.c.down_probes <= 7  # (6, 12, 24, 48 s apart)


def test_half_thread_tries_cost_at_most_one_run_in_two_hundred() -> None:
    """A long run (a 1.2 s batch) is tried on half the threads no sooner than
    `STALL_DOWN_SPACING_RUNS` runs after its first runs and after each try, `STALL_PROBE_RUNS`
    runs a try: the quiet cost stays ~0.5 % of its time."""
    h = quiet(16, ms=1200.0)
    slow_half = lambda c: 1200 * MS * 16 / c if c < 16 else 1200 * MS  # noqa: E731
    h.run(slow_half, STALL_DOWN_SPACING_RUNS - 50)
    assert h.c.down_probes == 0
    h.run(slow_half, 100)
    assert h.c.down_probes == 1 and h.c.changes == 0
    assert h.used.count(8) == STALL_PROBE_RUNS


def test_noise_does_not_move_it() -> None:
    f = quiet()
    # slow runs, STALL_RUNS - 1 in a row, but as many fast ones after them (each fast run
    # takes the oldest slow one out of the streak)
    for _ in range(20):
        f.run(35 * MS, STALL_RUNS - 1)
        f.run(10 * MS, STALL_RUNS - 1)
    # a steady 1.5x (a slower machine, not a stall)
    f.run(15 * MS, 50)
    assert f.c.count == 2 and f.c.changes == 0
    assert f.used.count(1) == f.c.down_probes  # (half the threads, once in a while)


def test_the_first_runs_set_the_best_before_stalls_count() -> None:
    """A program's first runs (cold caches, pools starting) are slow: no stall."""
    f = Feed(2)
    f.run(50 * MS, STALL_BEST_AFTER)
    f.run(10 * MS, 10)
    assert f.c.count == 2 and f.c.best[2] == pytest.approx(10 * MS)


def test_short_runs_need_an_absolute_excess() -> None:
    f = quiet(ms=0.02)  # 20 us runs: 3x is 40 us more, within a scheduler's jitter
    f.run(0.06 * MS, 10)
    assert f.c.count == 2


def test_recovery_restores_the_full_count() -> None:
    f = quiet()
    f.run(30 * MS, STALL_RUNS)
    # while the neighbour stays: 1 thread 15 ms, 2 threads 30 ms; probes fail, holds double
    f.run({1: 15 * MS, 2: 30 * MS}, int(STALL_HOLD_S * 4 / (15 * MS)))
    probes = [k for k, u in enumerate(f.used) if u == 2 and f.used[k - 1] != 2][1:]  # starts
    assert len(probes) >= 2 and f.c.count == 1 and f.c.restored == 0
    gaps = np.diff(probes)
    assert all(b > a for a, b in zip(gaps, gaps[1:], strict=False))  # backing off
    # the neighbour goes: the next probe finds the full count fast again
    events = f.run({1: 15 * MS, 2: 10 * MS}, int(threads.STALL_HOLD_MAX_S / (15 * MS)) + 2)
    assert "restored" in events and f.c.count == 2
    assert f.c.want(f.now) == 2 and f.used[-1] == 2
    # and stays (no probe schedule left, hold time back to the start)
    f.run(10 * MS, 100)
    assert f.c.count == 2 and f.c.lowered == 1 and f.used[-100:].count(1) <= 1


def test_probes_climb_to_the_cores_the_neighbours_leave() -> None:
    """16 threads, 2 cores busy: a run on c threads takes 160 ms / c up to 14 threads and
    stalls beyond (60 ms); halved to 8, the probes climb to 14 and stop there; with the
    neighbours gone they go on to 16."""
    f = quiet(16, ms=10.0)
    busy = lambda c: 160 * MS / c if c <= 14 else 60 * MS  # noqa: E731
    f.run(busy, STALL_RUNS)
    assert f.c.count == 8
    f.run(busy, 400)  # 400 x ~12 ms: several holds
    assert f.c.count == 14 and f.c.raised == 2 and f.c.restored == 0
    assert {u for u in f.used[-300:]} <= {14, 15}  # probes of 15 fail, backing off
    f.run(lambda c: 160 * MS / c, 600)
    assert f.c.count == 16 and f.c.restored == 1 and f.c.want(f.now) == 16


def test_a_raised_count_that_stalls_goes_back_to_where_it_began() -> None:
    """A probe of 12 was fast by luck: when 12 then stalls, 8 comes back (not 12 / 2)."""
    f = quiet(16, ms=10.0)
    f.run(60 * MS, STALL_RUNS)
    assert f.c.count == 8
    lucky = iter([10 * MS] * STALL_PROBE_RUNS)  # the runs of the first probe of 12
    # (the first probe after a lowering tries 16: still stalled; the next tries 12)
    f.run(lambda c: 20 * MS if c <= 8 else 60 * MS if c == 16 else next(lucky, 60 * MS), 120)
    assert f.c.raised == 1 and f.c.lowered == 2 and f.c.count == 8


def test_a_passing_hiccup_gives_every_thread_back_at_the_first_probe() -> None:
    """A lowering's first probe tries the full count: a hiccup that has passed costs one hold
    on the lowered count, not a climb of several."""
    f = quiet(16, ms=10.0, runs=20)
    f.run(40 * MS, STALL_RUNS)
    assert f.c.count == 8
    f.run(lambda c: 10 * MS * 16 / c, 60)
    assert f.c.restored == 1 and f.c.raised == 0 and f.c.count == 16
    assert set(f.used[-60:]) == {8, 16}


def test_a_short_hiccup_is_not_a_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three slow runs of a 1.4 ms program (together 12 ms, under the span) do not halve it;
    a stall that goes on does, once its slow runs fill the span."""
    monkeypatch.setattr(threads, "STALL_MIN_SPAN_S", REAL_SPAN)
    f = quiet(16, ms=1.4, runs=20)
    f.run(4 * MS, STALL_RUNS)
    assert f.c.count == 16 and f.c.lowered == 0
    slow = int(REAL_SPAN / (4 * MS))  # (with the three above: past the span)
    f.run(lambda c: 4 * MS if c == 16 else 2.8 * MS, slow)
    assert f.c.count == 8 and f.c.lowered == 1


@pytest.mark.parametrize(
    ("ms", "after"),
    [
        (8.4, [84.0, 30.0, 21.0]),
        (1.35, [77.0, 20.2, 6.5, 1.5]),
        (5.7, [55.4, 33.4, 18.7, 16.6, 16.0, 19.4, 14.2]),
    ],
)
def test_a_neighbour_that_passes_in_a_fraction_of_a_second_is_not_a_stall(
    monkeypatch: pytest.MonkeyPatch, ms: float, after: list[float]
) -> None:
    """The runs after an ONNX Runtime session in the same process ran (its pool spins for
    80-175 ms after its last run: ResNet-50 b1, MobileNetV2 b1 and b8 on the 16-core host,
    benchmarks/results/adapt16.md) keep every thread; the same stall lasting longer than the
    span halves them."""
    monkeypatch.setattr(threads, "STALL_MIN_SPAN_S", REAL_SPAN)
    f = quiet(16, ms=ms, runs=40)
    for _ in range(5):  # an ORT block, then ours, five times
        f.now += 0.3
        f.run(lambda c, it=iter(after): next(it, ms) * MS, len(after) + 20)
        assert f.c.count == 16 and f.c.lowered == 0
    stall = max(after) * MS
    f.run(stall, int(REAL_SPAN / stall) + 1)
    assert f.c.count == 8 and f.c.lowered == 1


def test_a_probe_faster_than_the_lowered_runs_restores_it() -> None:
    """The stall eased but did not end: the full count is faster than the lowered one again."""
    f = quiet()
    f.run(30 * MS, STALL_RUNS)
    f.run({1: 25 * MS, 2: 18 * MS}, 60)
    # (still 1.8x the quiet best, so 2 threads are lowered again now and then, each time for
    # longer before the next look: most runs take the faster 2)
    assert f.c.restored >= 1 and f.used[-30:].count(2) >= 20


def test_fewer_threads_that_do_not_help_are_given_back() -> None:
    f = quiet()
    f.run(30 * MS, STALL_RUNS)
    assert f.c.count == 1
    events = f.run({1: 40 * MS, 2: 30 * MS}, STALL_RUNS)
    assert events[-1] == "restored" and f.c.count == 2
    f.run({1: 40 * MS, 2: 30 * MS}, STALL_RUNS)  # no new lowering during the hold
    assert f.c.count == 2 and f.c.lowered == 1


def test_runs_the_budget_cut_short_only_update_their_own_best() -> None:
    f = quiet()
    for _ in range(10):  # another run held a thread: this one got 1 (and is slow)
        f.c.record(1, 30 * MS, f.now)
    assert f.c.count == 2 and f.c.changes == 0 and f.c.best[1] == pytest.approx(30 * MS)


def test_one_thread_programs_have_nothing_to_lower() -> None:
    f = quiet(1)
    f.run(50 * MS, 10)
    assert f.c.count == 1 and f.c.changes == 0


def test_concurrent_runs_are_safe() -> None:
    """Many threads asking and reporting at once: counts stay valid, every run is counted."""
    c = StallAdapt(16)
    errors: list[BaseException] = []
    per_thread = 2000

    def work(k: int) -> None:
        try:
            rng = np.random.default_rng(k)
            for i in range(per_thread):
                used = c.want()
                assert 1 <= used <= 16
                slow = (i // 50) % 2 == 1  # stalls come and go
                c.record(used, float(rng.uniform(10, 12) * (3 if slow else 1)) * MS)
        except BaseException as exc:  # noqa: BLE001 (collected, re-raised by the test)
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    assert sum(c.runs.values()) == 8 * per_thread
    assert 1 <= c.count <= 16 and c.lowered >= 1


# --- the run scope ------------------------------------------------------------------------


torch = pytest.importorskip("torch")

from pygraphx.targets.cpu import scheduling  # noqa: E402
from pygraphx.targets.cpu.scheduling import LOAD_ADAPT_ENV, RunScope  # noqa: E402


def test_the_switch_and_prepare_scope_have_no_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STALL_ADAPT_ENV, "off")
    assert RunScope(2).stall is None
    monkeypatch.delenv(STALL_ADAPT_ENV)
    assert RunScope(2).stall is not None
    assert RunScope(2, stall=False).stall is None
    assert RunScope(1).stall is None


def test_run_scope_takes_fewer_threads_after_a_stall_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(LOAD_ADAPT_ENV, "0")
    monkeypatch.delenv(STALL_ADAPT_ENV, raising=False)
    scope = RunScope(2)
    now = [0.0]
    scope._perf = lambda: now[0]
    assert scope.stall is not None
    scope.stall.clock = lambda: now[0]
    caller = torch.get_num_threads()

    def run(ms: float) -> int:
        with scope():
            took = torch.get_num_threads()
            now[0] += ms * MS
        assert torch.get_num_threads() == caller
        return took

    with caplog.at_level(logging.INFO, logger="pygraphx.cpu"):
        assert [run(10) for _ in range(10)] == [2] * 10
        [run(30) for _ in range(STALL_RUNS)]
        assert run(15) == 1
        scope.timed = False  # a profiled run: not fed to the controller
        now[0] += 10.0  # a probe is due: this run takes it
        assert run(500) == 2
        scope.timed = True
        assert scope.stall.count == 1 and scope.stall.restored == 0
        # the probe's other runs come, but one result never did: no decision on two runs
        assert [run(10) for _ in range(STALL_PROBE_RUNS - 1)] == [2] * (STALL_PROBE_RUNS - 1)
        assert scope.stall.count == 1 and scope.stall.restored == 0
        now[0] += 10.0  # a hold later another probe, whole this time
        assert [run(10) for _ in range(STALL_PROBE_RUNS)] == [2] * STALL_PROBE_RUNS
        assert scope.stall.count == 2 and scope.stall.restored == 1
        assert run(10) == 2
        [run(30) for _ in range(STALL_RUNS)]
        assert scope.stall.count == 1 and scope.stall.lowered == 2
    told = [r for r in caplog.records if "runs stalled" in r.getMessage()]
    assert len(told) == 1 and "1 of 2 threads" in told[0].getMessage()
    assert STALL_ADAPT_ENV in told[0].getMessage()
    assert not [r for r in caplog.records if "machine is busy" in r.getMessage()]  # (the load's)


# --- end to end: real spinning neighbours -------------------------------------------------


def _gemm_chain(k: int = 6, d: int = 384, rows: int = 96) -> tuple[object, dict, np.ndarray]:
    import pygraphx
    from tests.helpers import make_model

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, d)).astype(np.float32)
    ws = [(rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32) for _ in range(k)]
    nodes, cur = [], "x"
    for i in range(k):
        nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [f"y{i}"]))
        nodes.append(helper.make_node("Tanh", [f"y{i}"], [f"t{i}"]))
        cur = f"t{i}"
    model = make_model(nodes, {"x": x}, [cur], {f"w{i}": w for i, w in enumerate(ws)})
    want = x
    for w in ws:
        want = np.tanh(want @ w)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    return prog, {"x": x}, want


#: the end-to-end run, in a child process confined to two CPUs with its spinners (so that
#: the test loads two cores whatever the machine has): prints the controller's moves as JSON
_CHILD = """
import json, os, subprocess, sys, time
cpus = set(json.loads(sys.argv[1]))
os.sched_setaffinity(0, cpus)  # before torch: its OpenMP workers inherit the mask
os.environ["PGX_CPU_LOAD_ADAPT"] = "0"
os.environ.pop("PGX_CPU_STALL_ADAPT", None)
import numpy as np
import pygraphx
from pygraphx.targets.cpu import threads
from tests.targets.test_adapt15_stall import _gemm_chain
threads.STALL_HOLD_S, threads.STALL_HOLD_MAX_S = 0.05, 0.2  # many probes in a short test
prog, feeds, want = _gemm_chain()
prog.compile(pygraphx.get_target("cpu", threads=2))
stall = prog._executable.scope.stall
for _ in range(20):
    out = prog.run(feeds)
np.testing.assert_allclose(out[0], want, rtol=1e-4, atol=1e-4)  # numpy's products
spin = "import os, sys; os.sched_setaffinity(0, %r)\\nwhile True: pass" % (cpus,)
spinners = []
try:
    for _ in range(4):  # two per CPU
        spinners.append(subprocess.Popen([sys.executable, "-c", spin]))
    end = time.monotonic() + 20.0
    while stall.lowered == 0 and time.monotonic() < end:
        prog.run(feeds)
finally:
    for p in spinners:
        p.kill()
    for p in spinners:
        p.wait()
lowered = stall.lowered
end = time.monotonic() + 30.0
while stall.count < 2 and time.monotonic() < end:
    prog.run(feeds)
np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
print(json.dumps({"lowered": lowered, "restored": stall.restored, "count": stall.count}))
"""


def test_spinning_neighbours_lower_the_count_and_it_comes_back() -> None:
    """Beside 2 spinning processes per CPU a 2-thread program's runs stall: the count comes
    down; with them gone it comes back (the hold times shortened so that the test's probes
    are many). Only the controller's moves are checked, never a timing ratio."""
    from pathlib import Path

    cpus = sorted(threads.affinity_cpus())
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(cpus[:2])],
        capture_output=True, text=True, timeout=240, cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["lowered"] >= 1
    assert got["count"] == 2 and got["restored"] >= 1


def test_profiled_runs_are_not_fed_to_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    import pygraphx

    monkeypatch.delenv(STALL_ADAPT_ENV, raising=False)
    prog, feeds, _ = _gemm_chain(k=2, d=64, rows=8)
    prog.compile(pygraphx.get_target("cpu", threads=2))
    stall = prog._executable.scope.stall
    prog.run(feeds)
    prog.run(feeds, observer=lambda *a: None)
    assert sum(stall.runs.values()) == 1
    assert scheduling.RunScope is type(prog._executable.scope)


@pytest.mark.parametrize("fast_every", [10, 5, 3])
def test_a_neighbour_that_lets_some_runs_through_is_still_a_stall(
    monkeypatch: pytest.MonkeyPatch, fast_every: int
) -> None:
    """A 1.4 ms program beside a neighbour that makes most runs 2.5x slower but lets every
    `fast_every`-th through at full speed: a fast run takes only the oldest slow run out of the
    streak, so the count comes down within a second (review16b: with the streak cleared by each
    fast run, one fast run in five kept all 16 threads for a minute)."""
    monkeypatch.setattr(threads, "STALL_MIN_SPAN_S", REAL_SPAN)
    f = quiet(16, ms=1.4, runs=40)
    start = f.now
    k = [0]

    def run(c: int) -> float:
        k[0] += 1
        return 1.4 * MS if k[0] % fast_every == 0 else 3.5 * MS

    while f.c.lowered == 0 and f.now - start < 5.0:
        f.run(run, 1)
    assert f.c.lowered == 1 and f.now - start < 1.0


def test_one_slow_run_in_three_is_not_a_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    """Noise that slows one run in three past the ratio, on a 10 ms program, never fills the
    streak: the fast runs take it out faster than it fills."""
    monkeypatch.setattr(threads, "STALL_MIN_SPAN_S", REAL_SPAN)
    f = quiet(16, ms=10.0, runs=20)
    f.run(lambda c, k=iter(range(10**6)): (17 if next(k) % 3 == 0 else 10) * MS, 600)
    assert f.c.lowered == 0 and f.c.count == 16
