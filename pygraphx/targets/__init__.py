"""Targets by name: `get_target("ref")` (the numpy oracle); `cpu` and `gpu` come later."""

from __future__ import annotations

from pygraphx.targets.base import Target


def get_target(name: str) -> Target:
    """The target called `name` (MIGraphX's `get_target`)."""
    if name == "ref":
        from pygraphx.targets.ref.target import RefTarget

        return RefTarget()
    if name == "cpu":
        return __import__("pygraphx.targets.cpu", fromlist=["make_target"]).make_target()
    known = ["ref"]
    raise ValueError(f"unknown target {name!r}; available targets: {', '.join(known)}")


__all__ = ["Target", "get_target"]
