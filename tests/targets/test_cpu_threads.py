"""The cpu target's thread policy (`targets/cpu/threads.py`, `scheduling.py`).

How many threads (affinity and SMT topology from a fake sysfs tree, cgroup v1/v2 quota files
from fake cgroup trees, `PGX_CPU_THREADS`, `threads=`, the cap), how many per step, and runs of
two programs at once from two Python threads (outputs checked against numpy).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu import threads as th  # noqa: E402
from pygraphx.targets.cpu.scheduling import with_thread_switches  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(0)


def fake_sysfs(root: Path, cores: list[tuple[int, int]]) -> Path:
    """cpu<k>/topology with (package, core) ids."""
    for k, (package, core) in enumerate(cores):
        topo = root / f"cpu{k}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    return root


# --- how many -------------------------------------------------------------------------------


def test_physical_cores_counts_smt_siblings_once(tmp_path: Path) -> None:
    # 2 sockets x 2 cores x 2 hyper-threads; Linux numbers the siblings after the cores
    sysfs = fake_sysfs(tmp_path, [(0, 0), (0, 1), (1, 0), (1, 1)] * 2)
    assert th.physical_cores(range(8), sysfs) == 4
    assert th.physical_cores([0, 4], sysfs) == 1  # an affinity mask of one core's two threads
    assert th.physical_cores([0, 1, 2], sysfs) == 3


def test_physical_cores_without_topology(tmp_path: Path) -> None:
    assert th.physical_cores([0, 1, 5], tmp_path) == 3


def test_cgroup_v2_quota_smallest_along_ancestors(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "a" / "cpu.max").write_text("250000 100000\n")
    self_cgroup = tmp_path / "self"
    self_cgroup.write_text("0::/a/b\n")
    assert th.cgroup_cpu_limit(tmp_path, self_cgroup) == pytest.approx(2.5)
    (tmp_path / "a" / "cpu.max").write_text("max 100000\n")
    assert th.cgroup_cpu_limit(tmp_path, self_cgroup) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    d = tmp_path / "cpu,cpuacct" / "docker" / "x"
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text("150000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    self_cgroup = tmp_path / "self"
    self_cgroup.write_text("5:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n0::/\n")
    assert th.cgroup_cpu_limit(tmp_path, self_cgroup) == pytest.approx(1.5)
    (d / "cpu.cfs_quota_us").write_text("-1\n")
    assert th.cgroup_cpu_limit(tmp_path, self_cgroup) is None
    assert th.cgroup_cpu_limit(tmp_path, tmp_path / "missing") is None


def test_default_threads_quota_and_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(th.CAP_ENV, raising=False)
    sysfs = fake_sysfs(tmp_path, [(0, c) for c in range(64)])
    assert th.default_threads(range(64), None, sysfs=sysfs).n == th.DEFAULT_CAP
    assert th.default_threads(range(4), None, sysfs=sysfs).n == 4
    got = th.default_threads(range(64), 2.5, sysfs=sysfs)
    assert got.n == 3 and "cgroup quota 2.5" in got.detail
    monkeypatch.setenv(th.CAP_ENV, "16")
    assert th.default_threads(range(64), None, sysfs=sysfs).n == 16
    monkeypatch.setenv(th.CAP_ENV, "lots")
    with pytest.raises(ValueError, match=th.CAP_ENV):
        th.default_threads(range(64), None, sysfs=sysfs)


def test_resolve_threads_explicit_env_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(th.THREADS_ENV, "3")
    assert th.resolve_threads() == th.ThreadCount(3, th.THREADS_ENV)
    assert th.resolve_threads(5).n == 5  # explicit wins over the environment
    monkeypatch.setenv(th.THREADS_ENV, "many")
    with pytest.raises(ValueError, match="PGX_CPU_THREADS='many'"):
        th.resolve_threads()
    monkeypatch.setenv(th.THREADS_ENV, "0")
    with pytest.raises(ValueError, match="at least 1"):
        th.resolve_threads()
    with pytest.raises(ValueError, match="threads=0"):
        th.resolve_threads(0)
    monkeypatch.delenv(th.THREADS_ENV)
    got = th.resolve_threads()
    assert got.source == "default" and 1 <= got.n <= len(th.affinity_cpus())


def test_get_target_threads_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(th.THREADS_ENV, "2")
    assert pygraphx.get_target("cpu", threads=7).threads.n == 7
    assert pygraphx.get_target("cpu").threads.n == 2
    with pytest.raises(ValueError, match="takes no settings"):
        pygraphx.get_target("ref", threads=2)


# --- per step -------------------------------------------------------------------------------


def test_step_threads_by_work() -> None:
    n = 16
    assert th.step_threads([("add", 1000, 1)], n) == 1
    # worth 4 threads: the whole team (never a count in between, test_cpu_threads_policy.py)
    assert th.step_threads([("pointwise", 98_304 * 3, 1)], n) == n
    assert th.step_threads([("add", 10**8, 1)], n) == n
    # 128 x 768 x 768 GEMM: 75M multiply-adds, worth every thread
    assert th.step_threads([("dot", 128 * 768, 768)], n) == n
    # a 1x1 convolution on 7x7 with 64 input channels: 0.8M multiply-adds
    assert th.step_threads([("convolution", 256 * 49, 64)], n) == 1
    # a fused step counts its GEMM's work
    assert th.step_threads([("dot", 128 * 768, 768), ("pointwise", 10, 1)], n) == n


def gemm_and_add_model(m: int = 64, k: int = 256) -> tuple:
    """y = (a @ w) + b: one large GEMM and a tiny bias add (not fused: b is an input)."""
    a = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((k, k)).astype(np.float32)
    b = RNG.standard_normal((1, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["a", "w"], ["mm"]),
        helper.make_node("Slice", ["mm", "s0", "s1", "ax"], ["sl"]),
        helper.make_node("Add", ["sl", "b"], ["y"]),
    ]
    inits = {
        "w": w,
        "s0": np.array([0, 0], np.int64),
        "s1": np.array([1, 4], np.int64),
        "ax": np.array([0, 1], np.int64),
    }
    model = make_model(nodes, {"a": a, "b": b}, ["y"], inits)
    return model, {"a": a, "b": b}, (a @ w)[:1, :4] + b


def test_per_step_counts_and_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds, want = gemm_and_add_model(m=512, k=512)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=4))
    exe = prog._executable
    assert exe.threads == 4
    assert 4 in exe.step_threads and 1 in exe.step_threads
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), want, rtol=1e-4, atol=1e-4)
    off = pygraphx.parse_onnx_buffer(model.SerializeToString())
    off.compile(CpuTarget(threads=4, step_threads=False))
    assert set(off._executable.step_threads) == {4}
    monkeypatch.setenv(th.STEP_POLICY_ENV, "0")
    assert CpuTarget(threads=4).step_policy is False


def test_switches_set_each_step_count_within_the_limit() -> None:
    seen: list[int] = []

    def record() -> None:
        seen.append(torch.get_num_threads())

    before = torch.get_num_threads()
    try:
        limit = [3]
        fns = with_thread_switches([record] * 5, [1, 1, 4, 2, 1], limit)
        assert fns[1] is record and fns[0] is not record  # only where the count changes
        for fn in fns:
            fn()
        assert seen == [1, 1, 3, 2, 1]
    finally:
        torch.set_num_threads(before)


def test_run_restores_the_callers_thread_count() -> None:
    model, feeds, want = gemm_and_add_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=3))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(5)
        prog.run(feeds)
        assert torch.get_num_threads() == 5
    finally:
        torch.set_num_threads(before)


# --- concurrency ----------------------------------------------------------------------------


def _in_thread(budget: th.ThreadBudget, want: int, got: list[int]) -> threading.Thread:
    def run() -> None:
        got.append(budget.acquire(want))
        budget.release()

    t = threading.Thread(target=run)
    t.start()
    return t


def test_budget_shares_and_waits() -> None:
    budget = th.ThreadBudget(4)
    assert budget.acquire(8) == 8  # alone: what it asked for
    budget.release()
    assert budget.acquire(2) == 2
    got: list[int] = []
    _in_thread(budget, 4, got).join(5)
    assert got == [2]  # the 2 free ones (its fair share of 4 beside one other run)
    assert budget.acquire(3) == 2  # a run inside a run on this thread: the outer's threads
    budget.release()
    budget.release()
    assert budget.acquire(4) == 4  # all taken: another run waits for them
    waiting: list[int] = []
    t = _in_thread(budget, 4, waiting)
    time.sleep(0.2)
    assert waiting == []
    budget.release()
    t.join(5)
    assert waiting == [4]
    assert budget.free == budget.total and budget.holders == 0


def test_two_programs_in_two_python_threads() -> None:
    model1, feeds1, want1 = gemm_and_add_model(m=128, k=256)
    model2, feeds2, want2 = gemm_and_add_model(m=96, k=320)
    progs = []
    for model in (model1, model2):
        p = pygraphx.parse_onnx_buffer(model.SerializeToString())
        p.compile(pygraphx.get_target("cpu", threads=2))
        progs.append(p)
    errors: list[BaseException] = []

    def work(prog: pygraphx.Program, feeds: dict, want: np.ndarray) -> None:
        try:
            for _ in range(30):
                got = np.array(prog.run(feeds)[0])
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        except BaseException as exc:  # handed to the main thread, which fails the test
            errors.append(exc)

    workers = [
        threading.Thread(target=work, args=(progs[0], feeds1, want1)),
        threading.Thread(target=work, args=(progs[1], feeds2, want2)),
        threading.Thread(target=work, args=(progs[0], feeds1, want1)),  # the same program too
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not errors, errors
    assert th.BUDGET.free == th.BUDGET.total and th.BUDGET.holders == 0
