"""Targets by name: `get_target("ref")` (the numpy oracle), `get_target("cpu")` (torch on
the CPU: oneDNN/MKL) and `get_target("gpu")` (torch on one CUDA/ROCm device, CUDA graphs).

Importing this package registers the targets in `pygraphx.ir.registry`, so `Program.compile`
and `load` (in the IR, below this layer) find them by name.
"""

from __future__ import annotations

from typing import Any

from pygraphx.ir import registry
from pygraphx.targets.base import Target

KNOWN_TARGETS = ("ref", "cpu", "gpu")


def _make_ref() -> Target:
    from pygraphx.targets.ref.target import RefTarget

    return RefTarget()


def _make_cpu() -> Target:
    from pygraphx.targets.cpu import make_target  # needs torch; says how to install it

    return make_target()


def _make_gpu(**settings: Any) -> Target:
    from pygraphx.targets.gpu import make_target  # needs torch and a GPU; says what is missing

    return make_target(**settings)


registry.register_target("ref", _make_ref)
registry.register_target("cpu", _make_cpu)
registry.register_target("gpu", _make_gpu)


def get_target(name: str, **settings: Any) -> Target:
    """The target called `name`, to pass to `Program.compile` (MIGraphX's `get_target`).

    Args:
        name: `"ref"` (numpy, the reference), `"cpu"` (torch on the CPU) or `"gpu"` (torch on
            a CUDA or ROCm device).
        **settings: the target's own settings: cpu takes `threads=N` (default: the
            `PGX_CPU_THREADS` variable, else the usable physical cores, capped) and
            `step_threads=False`; gpu takes `device_id=N`; ref takes none.

    Raises:
        ValueError: an unknown target name (the message lists the known ones) or setting.
        GpuUnavailableError: `"gpu"` on a machine where torch sees no GPU (it says what is
            missing).

    Example:
        >>> prog.compile(pygraphx.get_target("cpu", threads=4))
    """
    if not settings:
        return registry.get_target(name)  # type: ignore[return-value]
    if name == "cpu":
        from pygraphx.targets.cpu import make_target

        return make_target(**settings)
    if name == "gpu":
        return _make_gpu(**settings)
    registry.get_target(name)  # an unknown name: its error, which lists the targets
    raise ValueError(f"the {name!r} target takes no settings (got {sorted(settings)})")


__all__ = ["KNOWN_TARGETS", "Target", "get_target"]
