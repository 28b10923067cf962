"""Targets by name: `get_target("ref")` (the numpy oracle) and `get_target("cpu")` (torch on
the CPU: oneDNN/MKL). The GPU target is not written yet.

Importing this package registers the targets in `pygraphx.ir.registry`, so `Program.compile`
and `load` (in the IR, below this layer) find them by name.
"""

from __future__ import annotations

from pygraphx.ir import registry
from pygraphx.targets.base import Target

KNOWN_TARGETS = ("ref", "cpu")


def _make_ref() -> Target:
    from pygraphx.targets.ref.target import RefTarget

    return RefTarget()


def _make_cpu() -> Target:
    from pygraphx.targets.cpu import make_target  # needs torch; says how to install it

    return make_target()


registry.register_target("ref", _make_ref)
registry.register_target("cpu", _make_cpu)


def get_target(name: str) -> Target:
    """The target called `name` (MIGraphX's `get_target`)."""
    return registry.get_target(name)  # type: ignore[return-value]


__all__ = ["KNOWN_TARGETS", "Target", "get_target"]
