"""The cpu target's thread policy on many cores (issue 10): per-step counts are the whole team
or one thread, so GNU OpenMP never ends and re-creates its workers between steps; the OpenMP
spin setting is in place before torch loads; the busy-machine rule counts the CPUs this process
may use. Outputs are checked against ONNX Runtime."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets import cpu  # noqa: E402
from pygraphx.targets.cpu import scheduling  # noqa: E402
from pygraphx.targets.cpu import threads as th  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(10)
ROOT = Path(__file__).resolve().parents[2]


# --- per-step counts ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 16, 64])
def test_step_counts_are_the_team_or_one(n: int) -> None:
    """Every amount of work, GEMM-like or element-wise, gets `n` threads or 1."""
    seen = set()
    for elems in (1, 10**3, 10**4, 65_536, 131_072, 10**6, 10**8):
        for inner in (1, 9, 64, 768):
            seen.add(th.step_threads([("dot", elems, inner)], n))
            seen.add(th.step_threads([("convolution", elems, inner)], n))
        seen.add(th.step_threads([("add", elems, 1)], n))
    assert seen == {1, n}


def test_threshold_is_two_threads_worth_of_work() -> None:
    n = 16
    per_thread = th.MIN_ELEMENTS_PER_THREAD
    assert th.step_threads([("add", 2 * per_thread - 1, 1)], n) == 1
    assert th.step_threads([("add", 2 * per_thread, 1)], n) == n
    macs = th.MIN_MACS_PER_THREAD
    assert th.step_threads([("dot", 2 * macs // 64 - 1, 64)], n) == 1
    assert th.step_threads([("dot", 2 * macs // 64, 64)], n) == n


def _plan_and_check(model: object, feeds: dict[str, np.ndarray], n: int = 16) -> list[tuple]:
    """(op names, thread count) of every step of `model` compiled for `n` threads; its outputs
    are checked against ONNX Runtime."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=n))
    for g, w in zip(prog.run(feeds), want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)
    exe = prog._executable
    names = [tuple(i.op.name for i in c) for c in exe.executor.computes]
    return list(zip(names, exe.step_threads, strict=True))


def _depthwise_clip(channels: int, side: int) -> tuple:
    """A 3x3 depthwise convolution with bias and Clip(0, 6), as in MobileNetV2."""
    feeds = {"x": RNG.standard_normal((1, channels, side, side)).astype(np.float32)}
    inits = {
        "w": RNG.standard_normal((channels, 1, 3, 3)).astype(np.float32),
        "b": RNG.standard_normal(channels).astype(np.float32),
        "lo": np.array(0, np.float32),
        "hi": np.array(6, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], group=channels, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["y", "lo", "hi"], ["z"]),
    ]
    return make_model(nodes, feeds, ["z"], inits), feeds


def test_a_depthwise_layer_with_its_epilogue_keeps_the_team() -> None:
    """MobileNetV2's 7x7 depthwise layer with its fused bias and clip: counting only the
    values from outside the step put it on one thread; on two cores the team of two was
    faster (host, alternating blocks: 4.78 ms a run against 4.38), so each result in the
    step counts, as it did."""
    for n in (2, 16):
        plan = _plan_and_check(*_depthwise_clip(960, 7), n=n)
        assert [t for names, t in plan if "convolution" in names] == [n]
        assert any("pointwise" in names for names, _ in plan if "convolution" in names), plan


def test_a_matrix_vector_product_counts_its_weights() -> None:
    """768x768 weights times one row: 0.6M multiply-adds (one thread's worth by arithmetic),
    but the step reads 2.4 MB of weights, which one thread streams far slower than 16 do."""
    feeds = {"a": RNG.standard_normal((1, 768)).astype(np.float32)}
    inits = {"w": RNG.standard_normal((768, 768)).astype(np.float32)}
    model = make_model([helper.make_node("MatMul", ["a", "w"], ["y"])], feeds, ["y"], inits)
    assert [t for names, t in _plan_and_check(model, feeds) if "dot" in names] == [16]


def test_a_gather_counts_the_rows_it_reads() -> None:
    """Four rows of a 30522 x 768 embedding table: 3k values moved, not the 23M of the table."""
    feeds = {"i": np.array([[1, 5, 30000, 7]], np.int64)}
    inits = {"t": RNG.standard_normal((30522, 768)).astype(np.float32)}
    model = make_model([helper.make_node("Gather", ["t", "i"], ["y"])], feeds, ["y"], inits)
    assert [t for names, t in _plan_and_check(model, feeds) if "gather" in names] == [1]


def test_step_work_reads_broadcasts_as_stored() -> None:
    """A broadcast operand counts the values it holds, not the positions it covers."""
    feeds = {"x": RNG.standard_normal((256, 1024)).astype(np.float32)}
    inits = {"b": RNG.standard_normal((1, 1024)).astype(np.float32)}
    model = make_model([helper.make_node("Add", ["x", "b"], ["y"])], feeds, ["y"], inits)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=4))
    (step,) = [c for c in prog._executable.executor.computes if c[-1].op.name != "@literal"]
    assert scheduling.step_work(step) == [("memory", 2 * 256 * 1024 + 1024, 1)]


def _two_sums() -> tuple:
    """Two independent element-wise steps of 524k and 131k elements read and written: under a
    policy of counts by work (1..N) they ran on 4 and 2 threads at N = 4."""
    feeds = {
        "a": RNG.standard_normal((512, 512)).astype(np.float32),
        "b": RNG.standard_normal((256, 256)).astype(np.float32),
    }
    inits = {"one": np.ones((1,), np.float32)}
    nodes = [
        helper.make_node("Add", ["a", "one"], ["ya"]),
        helper.make_node("Add", ["b", "one"], ["yb"]),
    ]
    return make_model(nodes, feeds, ["ya", "yb"], inits), feeds


def _thread_ids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _run_watching_threads(exe: object, feeds: dict[str, np.ndarray]) -> set[str]:
    """One run of the fast path's steps as `CpuExecutable.run` makes it (same scope and
    thread switches), the OS threads alive after each step (a worker created by one step and
    ended by the next is gone by the end of the run)."""
    seen = set()
    exe.executor.bind(feeds)
    with exe.scope():
        for fn in exe.executor.steps:
            fn()
            seen |= _thread_ids()
    return seen


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_runs_start_no_new_os_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """GNU OpenMP ends the surplus workers when a parallel region has a smaller team than the
    one before, and creates them again for a larger one: a run whose steps switched between
    teams of 4 and 3 created a new OS thread and ended it again in every run. With counts of 4
    or 1 the pool's threads stay."""
    monkeypatch.setenv(th.LOAD_ADAPT_ENV, "0")  # all 4 threads even on a busy machine
    model, feeds = _two_sums()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=4))
    exe = prog._executable
    assert set(exe.step_threads) <= {1, 4}
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        known = _run_watching_threads(exe, feeds)
        for _ in range(5):
            assert _run_watching_threads(exe, feeds) <= known, "a step started a new OS thread"
        got = prog.run(feeds)
    finally:
        torch.set_num_threads(before)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6, atol=1e-6)


# --- the busy-machine rule in a confined process ---------------------------------------------


@pytest.mark.parametrize(
    ("n", "load", "cpus", "usable", "want"),
    [
        (4, 40.0, 64, 64, 4),  # unconfined: 28 CPUs free
        (4, 40.0, 64, 4, 2),  # 4 of 64 CPUs: 36 x 4/64 = 2.25 of ours busy, two left
        (4, 10.0, 64, 4, 4),  # 6 x 4/64 = 0.4 of ours busy: all four
        (4, 80.0, 64, 8, 1),  # heavily loaded host: at least one thread
        (2, 3.0, 2, 2, 1),  # the 2-core case of test_cpu_scheduling: unchanged
    ],
)
def test_load_threads_counts_the_cpus_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch, n: int, load: float, cpus: int, usable: int, want: int
) -> None:
    monkeypatch.delenv(th.LOAD_ADAPT_ENV, raising=False)
    assert th.load_threads(n, load, cpus, usable) == want


def test_usable_cpus_is_the_affinity_bounded_by_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(th, "affinity_cpus", lambda: set(range(32)))
    monkeypatch.setattr(th, "cgroup_cpu_limit", lambda: 2.5)
    th.usable_cpus.cache_clear()
    try:
        assert th.usable_cpus() == 3
        monkeypatch.setattr(th, "cgroup_cpu_limit", lambda: None)
        th.usable_cpus.cache_clear()
        assert th.usable_cpus() == 32
        # the default of load_threads: a machine of 64 CPUs at load 40, this process on 32
        monkeypatch.setattr(th.os, "cpu_count", lambda: 64)
        monkeypatch.setattr(th.os, "getloadavg", lambda: (40.0, 40.0, 40.0))
        monkeypatch.delenv(th.LOAD_ADAPT_ENV, raising=False)
        assert th.load_threads(16) == 16  # 24 x 32/64 = 12 busy of 32: 20 left
        assert th.load_threads(16, 60.0) == 10  # 44 x 32/64 = 22 busy: 10 left
    finally:
        th.usable_cpus.cache_clear()


# --- OpenMP's spin setting -------------------------------------------------------------------


def _fresh_import(env_extra: dict[str, str]) -> list[str]:
    """In a fresh interpreter: import pygraphx, then print GOMP_SPINCOUNT, whether torch was
    loaded by the import, and `openmp_setting()`."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    code = (
        "import os, sys, pygraphx\n"
        "from pygraphx.targets.cpu import openmp_setting\n"
        "print(os.environ.get('GOMP_SPINCOUNT'))\n"
        "print('torch' in sys.modules)\n"
        "print(openmp_setting())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def test_import_pygraphx_sets_the_spin_before_torch_loads() -> None:
    """`import pygraphx` loads torch (generation's device loop imports it), so the spin
    setting must be made before that import; it was not, and GNU OpenMP kept its default."""
    spin, torch_loaded, setting = _fresh_import({})
    assert spin == cpu.spincount()  # the subprocess has this process's CPUs
    assert torch_loaded == "True"  # why the order matters
    assert setting == f"GOMP_SPINCOUNT={spin} (set by pygraphx)"


def test_many_cores_spin_longer() -> None:
    """Spin 10000 where the process may use 8 or more physical cores, 1000 below: on the
    16-core host BERT-base and ResNet-50 at batch 1 ran 10-20% faster at 10000 (the gaps of
    view steps between a transformer's GEMMs outlast 1000 rounds), while on a few shared cores
    long spinning took the time slices other work needed."""
    assert cpu.spincount(2) == cpu.spincount(cpu.MANY_CORES - 1) == cpu.SPINCOUNT == "10000"
    assert cpu.spincount(cpu.MANY_CORES) == cpu.spincount(64) == cpu.SPINCOUNT_MANY == "10000"
    assert cpu.spincount() == cpu.spincount(th.BUDGET.total)


def test_a_cgroup_quota_of_two_cores_keeps_the_short_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default counts the physical cores the process may use, quota included."""
    counted = th.default_threads(cpus=range(16), quota=2.0, cap=1 << 30).n
    assert counted == 2
    assert cpu.spincount(counted) == cpu.SPINCOUNT


def test_the_users_openmp_setting_is_kept_and_named() -> None:
    spin, _, setting = _fresh_import({"GOMP_SPINCOUNT": "7"})
    assert spin == "7"
    assert setting == "GOMP_SPINCOUNT=7 (from the environment)"
