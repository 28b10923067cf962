"""`benchmarks/cpu_threads_probe.py --ab`'s accounting (issue 10): each engine's own CPU time
counts the threads it ran on (ONNX Runtime's pool vs every other thread), read from the
kernel's per-thread counters; the engine list and the per-round ratios to ORT."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytest.importorskip("torch")
probe = pytest.importorskip("benchmarks.cpu_threads_probe")


def _burn(seconds: float, tids: list[int]) -> None:
    tids.append(threading.get_native_id())
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_own_cpu_counts_the_engines_threads() -> None:
    """A thread that runs 0.2 CPU-seconds (by its own clock) is ORT's when it is in ORT's set,
    and then not counted for pygraphx; read while it is alive (an ended thread leaves /proc)."""
    tids: list[int] = []
    ready, done = threading.Event(), threading.Event()

    def hold() -> None:
        _burn(0.2, tids)
        ready.set()
        done.wait()

    worker = threading.Thread(target=hold)
    before = probe.thread_cpu_ns()
    worker.start()
    ready.wait()
    after = probe.thread_cpu_ns()
    done.set()
    worker.join()
    ort = {tids[0]}
    as_ort = probe.own_cpu_ms(before, after, ort, "ort")
    as_pgx = probe.own_cpu_ms(before, after, ort, "pgx")
    assert 190 <= as_ort <= 190 + 150  # its 200 ms (clock granularity) plus the caller's wait
    assert as_pgx < 150  # the caller only waited


def test_parse_engines() -> None:
    args = type("A", (), {"engines": ["on@16", "off@8", "ort@16"], "no_ort": False})()
    assert probe.parse_engines(args, 0) == [
        ("on@16", "on", 16), ("off@8", "off", 8), ("ort@16", "ort", 16)
    ]  # fmt: skip
    args.engines = None
    assert [s[0] for s in probe.parse_engines(args, 4)] == ["on@4", "off@4", "ort@4"]
    for bad in ("on16", "eager@4", "on@x"):
        args.engines = [bad]
        with pytest.raises(SystemExit, match="--engines"):
            probe.parse_engines(args, 0)


def test_over_ort_is_the_median_of_per_round_ratios() -> None:
    rng = np.random.default_rng(3)
    mine = [tuple(rng.uniform(1, 10, 3)) for _ in range(5)]
    ort = [tuple(rng.uniform(1, 10, 3)) for _ in range(5)]
    got = probe.over_ort(mine, ort)
    ratios = np.array(mine) / np.array(ort)
    for k, key in enumerate(("ms", "cpu_ms", "own_cpu_ms")):
        assert got[key] == pytest.approx(float(np.median(ratios[:, k])))
