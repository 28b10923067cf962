"""run17: the per-run cost around the steps. The stall controller's short way for the common
run (`StallAdapt._lean`, set by the run scope) leaves it in exactly the state the long way does;
the run scope's exit still gives the caller's thread count back; a cpu program's runs take one
lock (the executable's), still safe from several Python threads (numpy oracle); outputs stay
owned. (tidy18 removed run17's switches back to the old path, `LEAN_RUN` / `LEAN_SCOPE`: these
test the one path.)"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu import scheduling, target, threads  # noqa: E402
from pygraphx.targets.cpu.scheduling import LOAD_ADAPT_ENV, RunScope  # noqa: E402
from pygraphx.targets.cpu.threads import StallAdapt  # noqa: E402
from tests.helpers import make_model  # noqa: E402


def _state(c: StallAdapt) -> dict:
    skip = {"_lock", "_lean", "clock"}
    out = {}
    for k, v in vars(c).items():
        if k in skip:
            continue
        if isinstance(v, threads.SlowStreak):
            v = (list(v.runs), v.total)
        elif hasattr(v, "maxlen"):
            v = list(v)
        out[k] = v
    return out


@pytest.mark.parametrize("seed", range(6))
def test_stall_short_way_matches_the_long_way(seed: int) -> None:
    """Two controllers fed the same runs (quiet stretches, stalls, probes, new bests; the
    count each asks for), one with the short way: the same count asked, the same result of
    every `record`, the same state after every run."""
    rng = np.random.default_rng(seed)
    now = [0.0]
    long, short = StallAdapt(2, clock=lambda: now[0]), StallAdapt(2, clock=lambda: now[0])
    short._lean = True
    base = 0.004
    for k in range(3000):
        phase = (k // 300) % 3  # quiet, stalled (2 threads 3x slower), quiet
        used = long.want(now[0])
        assert short.want(now[0]) == used
        t = base * (1 + 0.1 * rng.random())
        if phase == 1 and used == 2:
            t *= 3.0
        if rng.random() < 0.02:
            t *= 2.5  # a hiccup
        if rng.random() < 0.01:
            t *= 0.7  # a new best
        now[0] += t
        assert long.record(used, t, now[0]) == short.record(used, t, now[0])
        assert _state(long) == _state(short), k
    assert long.changes > 0 and long.runs[2] > 100  # the sequence went both ways


def test_run_scope_takes_the_short_way() -> None:
    """A run scope's stall controller takes the short way (the one path since tidy18); a
    controller made alone keeps the long way (what the test above compares it with)."""
    assert RunScope(2, stall=True).stall._lean is True
    assert StallAdapt(2)._lean is False


def _counting(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    sets: list[int] = []
    gets: list[int] = []
    real_set, real_get = torch.set_num_threads, torch.get_num_threads

    def counting_set(n: int) -> None:
        sets.append(n)
        real_set(n)

    def counting_get() -> int:
        gets.append(1)
        return real_get()

    monkeypatch.setattr(torch, "set_num_threads", counting_set)
    monkeypatch.setattr(torch, "get_num_threads", counting_get)
    return sets, gets


def test_scope_exit_gives_the_callers_count_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scope whose steps switch nothing (`switches` False) reads torch's count back at the
    exit only where its enter set another (the caller's count is then restored); a scope whose
    steps switch reads it back and restores it."""
    monkeypatch.delenv(LOAD_ADAPT_ENV, raising=False)
    monkeypatch.setattr(scheduling.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    caller = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        sets, gets = _counting(monkeypatch)
        scope = RunScope(2, stall=False)
        scope.switches = False
        with scope():
            assert torch.get_num_threads() == 2
        gets.clear()
        with scope():
            pass
        assert sets == [] and len(gets) == 1  # (enter reads `before`; the exit does not)
        torch.set_num_threads(3)  # the caller's count is not the run's: set, then restored
        sets.clear()
        with scope():
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 3 and sets == [2, 3]
        scope.switches = True  # a step switching: read back and restored
        torch.set_num_threads(2)
        sets.clear()
        with scope():
            torch.set_num_threads(1)
        assert torch.get_num_threads() == 2 and sets == [1, 2]
    finally:
        monkeypatch.undo()
        torch.set_num_threads(caller)


def _mlp() -> tuple[bytes, tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 64)).astype(np.float32)
    w2 = rng.standard_normal((64, 16)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    model = make_model(nodes, {"x": np.zeros((4, 32), np.float32)}, ["y"], {"w1": w1, "w2": w2})
    return model.SerializeToString(), (w1, w2)


@pytest.mark.parametrize("step_threads", [True, False])  # False: no step switches
def test_runs_from_threads_with_one_lock(step_threads: bool) -> None:
    """The cpu executable is `reentrant` (the program takes no lock of its own) and its scope
    knows whether a step switches; runs from 6 Python threads give numpy's results. With
    `step_threads=False` every step runs on the program's count, so the exit's skip path runs
    concurrently (review17d)."""
    data, (w1, w2) = _mlp()
    prog = pygraphx.parse_onnx_buffer(data)
    prog.compile(target.CpuTarget(threads=2, step_threads=step_threads))
    exe = prog._executable
    assert exe.reentrant is True
    assert exe.scope.switches == any(c != 2 for c in exe.chained.counts)
    if not step_threads:
        assert not exe.scope.switches
    feeds = [np.random.default_rng(k).standard_normal((4, 32)).astype(np.float32)
             for k in range(6 * 40)]  # fmt: skip
    start = threading.Barrier(6)

    def worker(t: int) -> list[np.ndarray]:
        start.wait()
        return [np.array(prog.run({"x": feeds[t * 40 + r]})[0]) for r in range(40)]

    with ThreadPoolExecutor(6) as pool:
        got = [y for chunk in pool.map(worker, range(6)) for y in chunk]
    for x, y in zip(feeds, got, strict=True):
        np.testing.assert_allclose(y, np.maximum(x @ w1, 0) @ w2, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("where", ["cpu", "ref"])  # (ref hands back the input itself)
def test_program_outputs_stay_owned(where: str) -> None:
    """The outputs' arguments, made in one loop (`program._owned_arguments`), still copy an
    output that is the input itself, one returned twice and a literal; values by numpy."""
    c = np.arange(4, dtype=np.float32).reshape(1, 4)
    nodes = [
        helper.make_node("Identity", ["x"], ["a"]),
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Identity", ["r"], ["b"]),
        helper.make_node("Identity", ["c"], ["k"]),
    ]
    x0 = np.zeros((2, 4), np.float32)
    model = make_model(nodes, {"x": x0}, ["a", "r", "b", "k"], {"c": c})
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(target.CpuTarget(threads=1) if where == "cpu" else pygraphx.get_target("ref"))
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    outs = [np.array(o, copy=False) for o in prog.run({"x": x})]
    want = [x, np.maximum(x, 0), np.maximum(x, 0), c]
    for got, w in zip(outs, want, strict=True):
        np.testing.assert_array_equal(got, w)
        assert got.flags.writeable and not np.shares_memory(got, x)
    assert not np.shares_memory(outs[1], outs[2])
    assert not np.shares_memory(outs[3], prog.run({"x": x})[3].array)


def test_executable_without_reentrant_keeps_the_program_lock() -> None:
    """An executable that does not declare `reentrant` (the gpu target's, a custom target's) is
    still serialised by the program's lock: runs from 4 threads never overlap (review17d)."""
    data, _ = _mlp()
    prog = pygraphx.parse_onnx_buffer(data)
    prog.compile(target.CpuTarget(threads=1))
    inner = prog._executable
    state = {"now": 0, "peak": 0}
    guard = threading.Lock()

    class Serial:
        """Wraps the cpu executable, hiding its `reentrant`, and counts overlapping runs."""

        def __getattr__(self, name: str) -> object:
            if name == "reentrant":
                raise AttributeError(name)
            return getattr(inner, name)

        def run(self, *args: object, **kwargs: object) -> object:
            with guard:
                state["now"] += 1
                state["peak"] = max(state["peak"], state["now"])
            try:
                time.sleep(0.002)
                return inner.run(*args, **kwargs)
            finally:
                with guard:
                    state["now"] -= 1

    prog._executable = Serial()
    x = np.zeros((4, 32), np.float32)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: [prog.run({"x": x}) for _ in range(10)], range(4)))
    assert state["peak"] == 1
