"""The `cpu` target: programs lowered to torch on the CPU (oneDNN / MKL for conv and GEMM).

Importing this package does not import torch; `make_target()` does, and says how to install it
when it is missing.

OpenMP threads: when torch is not imported yet and the user has set neither `OMP_WAIT_POLICY`
nor `GOMP_SPINCOUNT`, `make_target()` sets `GOMP_SPINCOUNT=10000` first: an idle OpenMP worker
spins briefly (enough to catch the next operator's parallel region) and then sleeps, instead of
spinning for GNU OpenMP's default 300000 rounds. On a machine whose cores are shared with other
work, long-spinning workers lose their time slices and every parallel region then waits
milliseconds for them; workers that sleep at once (`OMP_WAIT_POLICY=PASSIVE`) cost a wake-up of
tens of microseconds per region instead. Measured here on 2 shared cores: a 98k-element add
took 5.4 ms with the default spinning under load and 0.23 ms with this setting, and MobileNetV2
at batch 1 ran in 5.8 ms with it against 11.0 ms with PASSIVE.

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
SPINCOUNT = "10000"


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
