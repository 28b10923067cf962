"""Targets by name: `get_target("ref")` (the numpy oracle), `get_target("cpu")` (torch on
the CPU: oneDNN/MKL) and `get_target("gpu")` (torch on one CUDA/ROCm device, CUDA graphs)."""

from __future__ import annotations

from typing import Any

from pygraphx.targets.base import Target

KNOWN_TARGETS = ("ref", "cpu", "gpu")


def get_target(name: str, **settings: Any) -> Target:
    """The target called `name` (MIGraphX's `get_target`); `settings` tune the gpu target
    (see `targets/gpu/target.py`). `get_target("gpu")` raises `GpuUnavailableError` saying
    what is missing when this machine cannot run it."""
    if settings and name != "gpu":
        raise ValueError(f"target {name!r} takes no settings here (got {sorted(settings)})")
    if name == "ref":
        from pygraphx.targets.ref.target import RefTarget

        return RefTarget()
    if name == "cpu":
        from pygraphx.targets.cpu import make_target  # needs torch; says how to install it

        return make_target()
    if name == "gpu":
        from pygraphx.targets.gpu import make_target as make_gpu_target

        return make_gpu_target(**settings)
    raise ValueError(f"unknown target {name!r}; available targets: {', '.join(KNOWN_TARGETS)}")


__all__ = ["KNOWN_TARGETS", "Target", "get_target"]
