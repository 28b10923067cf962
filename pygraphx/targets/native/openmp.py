"""Which OpenMP runtimes a process has loaded: native kernels and oneDNN must share torch's
(`libgomp.so.1` of the CPU wheel), or two thread pools fight for the cores."""

from __future__ import annotations

from pathlib import Path

#: the file names of OpenMP runtimes (GNU, Intel, LLVM)
OPENMP_LIBS = ("libgomp", "libiomp5", "libomp.so", "libomp-")


def openmp_runtimes() -> list[str]:
    """The OpenMP runtimes loaded in this process (their files; none off Linux)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []  # not Linux: nothing to check
    paths = {line.split()[-1] for line in maps.splitlines() if "/" in line}
    return sorted(p for p in paths if any(Path(p).name.startswith(n) for n in OPENMP_LIBS))


def openmp_shared() -> bool:
    """Whether the process has one OpenMP runtime loaded (torch's, shared with oneDNN and the
    native kernels): another one may come with a library, or with another package loaded first
    (scikit-learn's wheel bundles its own libgomp)."""
    return len(openmp_runtimes()) <= 1
