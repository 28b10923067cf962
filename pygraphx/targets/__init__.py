"""Targets by name: `get_target("ref")` (the numpy oracle) and `get_target("cpu")` (torch on
the CPU: oneDNN/MKL). The GPU target is not written yet."""

from __future__ import annotations

from typing import Any

from pygraphx.targets.base import Target

KNOWN_TARGETS = ("ref", "cpu")


def get_target(name: str, **settings: Any) -> Target:
    """The target called `name` (MIGraphX's `get_target`); keyword settings go to the target
    (`get_target("cpu", threads=4)`; `ref` takes none)."""
    if name == "ref":
        from pygraphx.targets.ref.target import RefTarget

        if settings:
            raise ValueError(f"the 'ref' target takes no settings (got {sorted(settings)})")
        return RefTarget()
    if name == "cpu":
        from pygraphx.targets.cpu import make_target  # needs torch; says how to install it

        return make_target(**settings)
    raise ValueError(f"unknown target {name!r}; available targets: {', '.join(KNOWN_TARGETS)}")


__all__ = ["KNOWN_TARGETS", "Target", "get_target"]
