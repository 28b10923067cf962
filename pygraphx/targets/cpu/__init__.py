"""The `cpu` target: programs lowered to torch on the CPU (oneDNN / MKL for conv and GEMM).

Importing this package does not import torch; `make_target()` does, and says how to install it
when it is missing.

OpenMP threads: when torch is not imported yet and the user has set neither `OMP_WAIT_POLICY`
nor `GOMP_SPINCOUNT`, `configure_openmp()` sets `GOMP_SPINCOUNT=SPINCOUNT`: an idle OpenMP
worker spins that many rounds (a `pause` each, 40-140 cycles by processor: tens of
microseconds) and then sleeps, instead of spinning for GNU OpenMP's default 300000 rounds
(milliseconds). Why not less: a run's parallel regions (oneDNN convolutions, GEMMs, torch's
kernels) are separated by the Python and dispatch time of the steps between them, 10-50 us;
workers that fall asleep in those gaps must be woken by a system call at every region, and a
team of 16 woken some 50 times per MobileNetV2 run costs milliseconds. Why not more: after a
run, or between runs, workers that keep spinning burn the time slices that other work on the
same cores needs (another thread pool, other processes), and every parallel region then waits
for its own descheduled laggards. History: GNU OpenMP's default spun so long that on 2 cores
shared with other work (load average 14) MobileNetV2 at batch 1 took 160-350 ms at spin 10000
against 7.4-51 ms at spin 100; on such a machine `scheduling.load_threads` now runs on one
thread, where no region starts at all. `benchmarks/cpu_threads_probe.py --spincounts 100 1000
10000` compares settings on a host.

`import pygraphx` calls `configure_openmp()`, so the setting holds whenever pygraphx is imported
before torch; when torch came first (GNU OpenMP reads the variable once, when it loads),
`make_target()` warns once and says what to do. `openmp_setting()` says what holds (the first
run logs it, level INFO, logger `pygraphx.cpu`).
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
SPINCOUNT = "1000"

#: what `configure_openmp` found or did (see `openmp_setting`)
_setting = ""


def configure_openmp() -> bool:
    """Bound how long idle OpenMP workers spin (see the module docstring), if it is not too
    late (torch not imported yet) and the user has not chosen. False when it is too late
    (`make_target` then says so once)."""
    global _setting
    if _setting.endswith("(set by pygraphx)") and os.environ.get("GOMP_SPINCOUNT") == SPINCOUNT:
        return True
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if name in os.environ:
            _setting = f"{name}={os.environ[name]} (from the environment)"
            return True
    if "torch" in sys.modules:
        _setting = "GNU OpenMP's default spin (torch was imported before pygraphx)"
        return False
    os.environ["GOMP_SPINCOUNT"] = SPINCOUNT
    _setting = f"GOMP_SPINCOUNT={SPINCOUNT} (set by pygraphx)"
    return True


def openmp_setting() -> str:
    """One line: the OpenMP waiting policy torch's workers run with, and who chose it."""
    return _setting or "not configured (pygraphx.targets.cpu.configure_openmp was not called)"


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


configure_openmp()  # on import: `import pygraphx` imports this package before anything loads torch

__all__ = ["SPINCOUNT", "configure_openmp", "make_target", "openmp_setting"]
