"""The `cpu` target: programs lowered to torch on the CPU (oneDNN / MKL for conv and GEMM).

Importing this package does not import torch; `make_target()` does, and says how to install it
when it is missing.

OpenMP threads: when torch is not imported yet and the user has set neither `OMP_WAIT_POLICY`
nor `GOMP_SPINCOUNT`, `configure_openmp()` sets `GOMP_SPINCOUNT=100`: an idle OpenMP worker
spins a few microseconds and then sleeps, instead of spinning for GNU OpenMP's default 300000
rounds. On cores shared with other work (another thread pool, other processes) spinning
workers burn the time slices their own team's laggards need, and every parallel region then
waits milliseconds for them. Measured on 2 cores shared with other work (load average 14),
MobileNetV2 at batch 1 on 2 threads, median of runs: spin 10000 (this target's earlier setting)
160-350 ms and 15-43 ms of process CPU time per run; spin 100: 7.4-51 ms, 7.5-9.5 ms CPU; spin 0
(`OMP_WAIT_POLICY=PASSIVE`): 6.5-14 ms, 6.5-7.6 ms CPU; ORT at the same moments 25-60 ms. On a
quiet machine a sleeping worker costs a wake-up per parallel region (MobileNetV2 was measured
earlier at 5.8 ms with spin 10000 against 11.0 ms with PASSIVE on quiet cores); the per-step
thread policy (`threads.py`) keeps small steps on one thread, so fewer regions pay it.
`benchmarks/cpu_threads_probe.py --spincounts 100 10000` compares settings on a host.

`import pygraphx` calls `configure_openmp()`, so the setting holds whenever pygraphx is imported
before torch; when torch came first (GNU OpenMP reads the variable once, when it loads),
`make_target()` warns once and says what to do.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pygraphx.targets.cpu.target import CpuTarget


def make_target(**settings: Any) -> CpuTarget:
    """The `cpu` target (needs torch); `settings` as `CpuTarget` takes them (`threads=N`)."""
    if not configure_openmp():
        _warn_spinning()
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "the 'cpu' target needs PyTorch, which is not installed: "
            "pip install 'pygraphx[torch]' (or pip install torch), or use get_target('ref')"
        ) from exc
    from pygraphx.targets.cpu.target import CpuTarget

    return CpuTarget(**settings)


#: GNU OpenMP spin rounds before an idle worker sleeps (see the module docstring)
SPINCOUNT = "100"


def configure_openmp() -> bool:
    """Bound how long idle OpenMP workers spin (see the module docstring), if it is not too
    late (torch not imported yet) and the user has not chosen. False when it is too late
    (`make_target` then says so once)."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return True
    if "torch" in sys.modules:
        return False
    os.environ["GOMP_SPINCOUNT"] = SPINCOUNT
    return True


_warned = False


def _warn_spinning() -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        "pygraphx cpu target: torch was imported before pygraphx, so OpenMP's idle workers "
        "spin for GNU OpenMP's default 300000 rounds, which slows runs when other work shares "
        f"the cores; import pygraphx first or set GOMP_SPINCOUNT={SPINCOUNT} in the environment",
        RuntimeWarning,
        stacklevel=3,
    )


__all__ = ["configure_openmp", "make_target"]
