"""The `cpu` target: programs lowered to torch on the CPU (oneDNN / MKL for conv and GEMM).

Importing this package does not import torch; `make_target()` does, and says how to install it
when it is missing.

OpenMP threads: when torch is not imported yet and the user has set neither `OMP_WAIT_POLICY`
nor `GOMP_SPINCOUNT`, `make_target()` sets `OMP_WAIT_POLICY=PASSIVE` first: idle OpenMP workers
then sleep instead of spinning. On a machine whose cores are shared with other work, spinning
workers lose their time slices and every parallel region waits milliseconds for them (measured
here: a 98k-element add took 8.8 ms with spinning workers and 11 us with sleeping ones); on an
idle machine the cost is a few microseconds of wake-up per parallel region.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pygraphx.targets.cpu.target import CpuTarget


def make_target() -> CpuTarget:
    """The `cpu` target (needs torch)."""
    configure_openmp()
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "the 'cpu' target needs PyTorch, which is not installed: "
            "pip install 'pygraphx[torch]' (or pip install torch), or use get_target('ref')"
        ) from exc
    from pygraphx.targets.cpu.target import CpuTarget

    return CpuTarget()


def configure_openmp() -> None:
    """Make idle OpenMP workers sleep (see the module docstring), if it is not too late."""
    if "torch" in sys.modules:
        return
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


__all__ = ["configure_openmp", "make_target"]
