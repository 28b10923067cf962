"""`benchmarks/cpu_accounting.py` (issue 10): each engine's own CPU time in a process that runs
several, from the kernel's per-thread counters; and `benchmarks/cpu_vs_peers.py`'s use of it
(an engine's own CPU leaves out another engine's pool still spinning from its runs, which the
process CPU time counts)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

acc = pytest.importorskip("benchmarks.cpu_accounting")


def _burn(seconds: float) -> None:
    """Run `seconds` of CPU on this thread (by its own clock)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class SpinningPool:
    """A stand-in for an engine's thread pool: one thread that, when poked, burns `seconds` of
    CPU (as a pool spinning after its work does) and then waits, alive, for the next poke."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.poke, self.idle, self.quit = threading.Event(), threading.Event(), threading.Event()
        self.idle.set()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.quit.is_set():
            if self.poke.wait(0.01):
                self.poke.clear()
                _burn(self.seconds)
                self.idle.set()

    def spin(self) -> None:
        self.idle.clear()
        self.poke.set()

    def close(self) -> None:
        self.quit.set()
        self.thread.join()


def test_pool_threads_are_the_engines_own() -> None:
    """In one window the caller burns 50 ms and a pool thread 100 ms: the pool's engine owns
    both (its pool and the caller), a caller-side engine only the caller's 50 ms, the pool's
    100 ms being the others'."""
    ledger = acc.ThreadLedger()
    with ledger.pool("ort", "ort"):
        pool = SpinningPool(0.1)
    try:
        assert pool.thread.native_id in ledger.pools["ort"]
        assert ledger.pool_of("ort") == "ort" and ledger.pool_of("pygraphx") == acc.CALLER
        before = ledger.start()
        pool.spin()
        _burn(0.05)
        pool.idle.wait()
        after = acc.thread_cpu_ns(caller_first=True)
    finally:
        pool.close()
    pgx = ledger.split(before, after, "pygraphx")
    ort = ledger.split(before, after, "ort")
    assert 50 <= pgx.own_ms <= 50 + 25
    assert 100 <= pgx.others_ms <= 100 + 25
    assert 150 <= ort.own_ms <= 150 + 25
    assert ort.others_ms < 25
    assert pgx.own_ms + pgx.others_ms == pytest.approx(ort.own_ms + ort.others_ms)


def test_unclaimed_threads_count_for_the_engine_running() -> None:
    """A thread started outside every pool window (GNU OpenMP's workers) counts for whichever
    engine's window it works in: the caller side's, or a pool engine's that shares the
    process's OpenMP (OpenVINO beside torch); another pool's threads are the others'."""
    ledger = acc.ThreadLedger()
    with ledger.pool("ov_f32", "openvino"):
        pass  # a pool that started no thread
    worker = SpinningPool(0.08)
    try:
        before = ledger.start()
        worker.spin()
        worker.idle.wait()
        window = ledger.stop(before, "pygraphx")
        for_ov = ledger.split(before, acc.thread_cpu_ns(), "ov_f32")
    finally:
        worker.close()
    assert 80 <= window.own_ms <= 80 + 25
    assert window.others_ms < 5
    assert 80 <= for_ov.own_ms <= 80 + 25 and for_ov.others_ms < 5
    assert window.per_run(4).own_ms == pytest.approx(window.own_ms / 4)


def _thread_group(tid: int) -> int | None:
    """The process (thread-group id) thread `tid` belongs to; None once it has ended."""
    try:
        with open(f"/proc/{tid}/status", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Tgid:"))
    except FileNotFoundError:
        return None


def test_caller_counter_is_its_thread_clock() -> None:
    snap = acc.thread_cpu_ns()
    me = threading.get_native_id()
    assert me in snap
    # Every id is a thread of this process: alive in it now, or gone since the snapshot (a
    # pool thread of another test in this worker may end in between; a thread of another
    # process would still be found under /proc with a different thread-group id).
    for tid in set(snap) - acc.thread_ids():
        assert _thread_group(tid) in (None, os.getpid()), tid
    assert abs(snap[me] - time.thread_time_ns()) < 20_000_000
    assert acc.thread_names({me}) and acc.thread_names({-1}) == []


class ScriptedClocks:
    """The threads' CPU counters of a fake process, advanced by fake engines (no real CPU is
    burnt, so a loaded machine cannot move the figures): a caller-side "pygraphx" that runs 4 ms
    on the caller, and an "ort" that runs 2 ms on the caller and leaves its pool spinning 6 ms
    into whatever runs next (the next engine's run, or its own next one)."""

    CALLER, POOL = 1, 2

    def __init__(self) -> None:
        self.ns = {self.CALLER: 0, self.POOL: 0}
        self.tail = 0

    def snapshot(self, caller_first: bool = False) -> dict[int, int]:
        return dict(self.ns)

    def process_time(self) -> float:
        return sum(self.ns.values()) / 1e9

    def _run(self, caller_ms: float, tail_ms: float) -> None:
        self.ns[self.POOL] += self.tail  # the last run's pool spins into this one
        self.ns[self.CALLER] += int(caller_ms * 1e6)
        self.tail = int(tail_ms * 1e6)

    def engines(self) -> dict:
        return {
            "pygraphx": lambda _feeds: self._run(4.0, 0.0),
            "ort": lambda _feeds: self._run(2.0, 6.0),
        }


@pytest.mark.parametrize("mode", ["blockwise", "neighbours"])
def test_peers_own_cpu_leaves_out_a_spinning_neighbour(mode: str, monkeypatch) -> None:
    """`cpu_vs_peers`'s timing on scripted thread clocks: pygraphx's own CPU per run is its
    4 ms however long ORT's pool spins into its runs (the process CPU carries that); ORT's is
    its caller's 2 ms plus what its pool spun inside its own runs' windows; the ratio to ORT is
    per round."""
    peers = pytest.importorskip("benchmarks.cpu_vs_peers")
    clocks = ScriptedClocks()
    monkeypatch.setattr(acc, "thread_cpu_ns", clocks.snapshot)
    monkeypatch.setattr(time, "process_time", clocks.process_time)
    ledger = acc.ThreadLedger(caller=clocks.CALLER)
    ledger.pools["ort"] = {clocks.POOL}
    ledger.engines["ort"] = "ort"
    got = getattr(peers, mode)(clocks.engines(), {}, 1, 6, ledger)
    assert set(got) == {"ms", "cpu_ms", "own_cpu_ms", "others_cpu_ms", "own_cpu_over_ort"}
    own, others, cpu = got["own_cpu_ms"], got["others_cpu_ms"], got["cpu_ms"]
    assert own["pygraphx"] == pytest.approx(4.0)
    assert others["ort"] == 0
    assert got["own_cpu_over_ort"]["ort"] == pytest.approx(1.0)
    if mode == "neighbours":
        # every pygraphx run follows an ORT run: the pool's 6 ms land in pygraphx's windows,
        # counted as the others' and in the process CPU, never as pygraphx's own
        assert others["pygraphx"] == pytest.approx(6.0)
        assert cpu["pygraphx"] == pytest.approx(10.0)
        assert own["ort"] == pytest.approx(2.0)
        assert got["own_cpu_over_ort"]["pygraphx"] == pytest.approx(2.0)
    else:
        # in its own block each ORT run carries its previous run's spin (the warm-up's for
        # the first); pygraphx's warm-up absorbs the spin of the ORT block before it
        assert own["ort"] == pytest.approx(8.0)
        assert others["pygraphx"] == 0 and cpu["pygraphx"] == pytest.approx(4.0)
        assert got["own_cpu_over_ort"]["pygraphx"] == pytest.approx(0.5)


def test_peers_summary_ratio_is_the_median_of_rounds() -> None:
    peers = pytest.importorskip("benchmarks.cpu_vs_peers")
    rng = np.random.default_rng(5)
    rounds = [
        {k: (1.0, 1.0, acc.Window(float(rng.uniform(1, 9)), 0.0)) for k in ("pygraphx", "ort")}
        for _ in range(5)
    ]
    got = peers._summary(rounds[0], rounds)
    want = np.median([r["pygraphx"][2].own_ms / r["ort"][2].own_ms for r in rounds])
    assert got["own_cpu_over_ort"]["pygraphx"] == pytest.approx(float(want))
    assert got["own_cpu_ms"]["ort"] == rounds[0]["ort"][2].own_ms


def test_peers_engines_claim_ort_and_openvino_pools() -> None:
    """`make_engines` on a small model at 2 threads: ONNX Runtime's intra-op pool (1 thread
    beside the caller) is claimed as "ort"; OpenVINO's threads, where it is installed, as
    "openvino"; pygraphx owns the rest."""
    peers = pytest.importorskip("benchmarks.cpu_vs_peers")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)}
    args = peers.parse_args(["--no-bf16", "--no-eager", "--conv-output", "torch"])
    engines, _, _, _, ledger = peers.make_engines(model, "tiny", feeds, args, 2)
    assert list(engines)[:2] == ["pygraphx", "ort"]
    assert len(ledger.pools["ort"]) >= 1
    assert ledger.pool_of("pygraphx") == acc.CALLER
    if peers.openvino_available():
        assert ledger.engines["ov_f32"] == ledger.engines["ov_default"] == "openvino"
        assert ledger.pools["openvino"] and not ledger.pools["openvino"] & ledger.pools["ort"]
    window = ledger.stop(ledger.start(), "pygraphx")
    assert window.own_ms >= 0 and window.others_ms >= 0
    assert "ort: " in ledger.describe() and "threads started since" in ledger.describe()


def test_neighbour_probe_buckets() -> None:
    """`cpu_neighbour_probe`'s per-bucket figures: runs by start time after the work before,
    their median latency (numpy's) and mean CPU and threads."""
    nb = pytest.importorskip("benchmarks.cpu_neighbour_probe")
    assert [nb.bucket_of(t) for t in (0.0, 9.9, 10.0, 49.0, 120.0)] == [0, 0, 10, 25, 100]
    rng = np.random.default_rng(7)
    runs = [
        {"at_ms": float(at), "ms": float(rng.uniform(1, 5)), "own_cpu_ms": 2.0,
         "others_cpu_ms": float(at < 25), "threads": 2, "trial": 0}
        for at in rng.uniform(0, 150, 60)
    ]  # fmt: skip
    got = nb.summarise(runs)
    early = [r["ms"] for r in runs if r["at_ms"] < 10]
    assert got["0"]["ms"] == pytest.approx(float(np.median(early)))
    assert got["0"]["runs"] == len(early) and got["0"]["others_cpu_ms"] == 1.0
    assert got["100"]["others_cpu_ms"] == 0.0 and got["100"]["threads"] == 2
    assert sum(b["runs"] for b in got.values()) == len(runs)


def test_neighbour_probe_paired_ratios() -> None:
    """Per trial, the first run and the runs of the first 50 ms against the trial's own steady
    median (runs from 100 ms on); medians over trials."""
    nb = pytest.importorskip("benchmarks.cpu_neighbour_probe")
    rng = np.random.default_rng(11)
    runs, first, early = [], [], []
    for t in range(5):
        ats = np.sort(rng.uniform(0, 150, 30))
        ms = rng.uniform(1, 5, 30)
        runs += [{"at_ms": float(a), "ms": float(m), "others_cpu_ms": 1.0, "trial": t}
                 for a, m in zip(ats, ms, strict=True)]  # fmt: skip
        steady = np.median(ms[ats >= 100])
        first.append(ms[0] / steady)
        early.append(ms[ats < 50].mean() / steady)
    got = nb.paired(runs)
    assert got["trials"] == 5
    assert got["first_over_steady"] == pytest.approx(float(np.median(first)))
    assert got["first_50ms_over_steady"] == pytest.approx(float(np.median(early)))
    assert nb.paired([{"at_ms": 1.0, "ms": 1.0, "others_cpu_ms": 0.0, "trial": 0}]) == {}


def test_gap_adaptive_takes_one_thread_after_a_busy_gap() -> None:
    """The prototype policy: N threads back to back, 1 after a gap in which the process's other
    threads kept at least half a CPU busy, N again after an idle gap. The clocks are scripted
    (wall, process CPU, caller CPU) readings: on a loaded machine a real busy thread may get
    too little of its gap's wall time to count as busy."""
    nb = pytest.importorskip("benchmarks.cpu_neighbour_probe")
    readings = iter(
        [
            (0.0, 0.0, 0.0), (0.010, 0.010, 0.010),  # first run: 10 ms of our CPU
            (0.0102, 0.0102, 0.0102), (0.020, 0.020, 0.020),  # back to back (0.2 ms gap)
            (0.050, 0.044, 0.020), (0.060, 0.054, 0.030),  # 30 ms gap, others used 24 ms (0.8)
            (0.090, 0.060, 0.030), (0.100, 0.070, 0.040),  # 30 ms gap, others 6 ms (0.2)
        ]
    )  # fmt: skip
    calls: list[str] = []
    adapt = nb.GapAdaptive(
        lambda f: calls.append("many"),
        lambda f: calls.append("one"),
        2,
        clocks=lambda: next(readings),
    )
    for _ in range(4):
        adapt({})
    assert calls == ["many", "many", "one", "many"]


def test_gap_adaptive_reads_the_process_clocks() -> None:
    """The real clocks: an idle gap (the caller sleeping, no other thread busy) keeps N."""
    nb = pytest.importorskip("benchmarks.cpu_neighbour_probe")
    wall, proc, mine = nb.process_clocks()
    _burn(0.01)
    wall2, proc2, mine2 = nb.process_clocks()
    assert mine2 - mine >= 0.01 and proc2 - proc >= 0.01 and wall2 - wall >= 0.01
    calls: list[str] = []
    adapt = nb.GapAdaptive(lambda f: calls.append("many"), lambda f: calls.append("one"), 2)
    adapt({})
    time.sleep(0.02)
    adapt({})
    assert calls == ["many", "many"]
