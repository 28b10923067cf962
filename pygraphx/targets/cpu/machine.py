"""What the machine gives this process: the CPUs it may run on, their physical cores, and the
CPU time its cgroups allow (`threads.py` reads them to pick the default thread count; they
are re-exported there)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["affinity_cpus", "cgroup_cpu_limit", "physical_cores"]


def affinity_cpus() -> set[int]:
    """The CPUs this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def physical_cores(cpus: Iterable[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> int:
    """Physical cores among `cpus` (SMT siblings counted once); `len(cpus)` where the topology
    is not readable."""
    cpus = sorted(set(cpus))
    cores: set[tuple[str, str]] = set()
    for cpu in cpus:
        topo = sysfs / f"cpu{cpu}" / "topology"
        try:
            package = (topo / "physical_package_id").read_text().strip()
            core = (topo / "core_id").read_text().strip()
        except OSError:
            return max(len(cpus), 1)
        cores.add((package, core))
    return max(len(cores), 1)


def cgroup_cpu_limit(
    root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")
) -> float | None:
    """CPUs' worth of time the process's cgroups allow (quota / period, the smallest along the
    cgroup's ancestors), or None when there is no quota."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            limits += _v2_limits(root, path)
        elif "cpu" in controllers.split(","):
            for base in {root / controllers, root / "cpu", root / "cpu,cpuacct"}:
                limits += _v1_limits(base, path)
    return min(limits) if limits else None


def _ancestors(base: Path, path: str) -> list[Path]:
    parts = [p for p in path.strip().split("/") if p]
    return [base.joinpath(*parts[:k]) for k in range(len(parts), -1, -1)]


def _v2_limits(root: Path, path: str) -> list[float]:
    out = []
    for d in _ancestors(root, path):
        try:
            fields = (d / "cpu.max").read_text().split()
        except OSError:
            continue
        if len(fields) == 2 and fields[0] != "max":
            out.append(int(fields[0]) / int(fields[1]))
    return out


def _v1_limits(base: Path, path: str) -> list[float]:
    out = []
    for d in _ancestors(base, path):
        try:
            quota = int((d / "cpu.cfs_quota_us").read_text())
            period = int((d / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        if quota > 0 and period > 0:
            out.append(quota / period)
    return out
