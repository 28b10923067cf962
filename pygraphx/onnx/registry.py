"""The ONNX handler registry: which function turns which ONNX op (domain, since-version) into IR.

Handlers register with `@onnx_op("Conv")` or `@onnx_op("Slice", since=10)`. For a node, the
handler chosen is the one with the greatest `since` not above the model's opset for the node's
domain, which is how ONNX versions operators.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DEFAULT_DOMAINS = ("", "ai.onnx")

# (domain, op_type) -> sorted list of (since_version, handler)
HANDLERS: dict[tuple[str, str], list[tuple[int, Callable[..., Any]]]] = {}


def _norm_domain(domain: str) -> str:
    return "" if domain in DEFAULT_DOMAINS else domain


def onnx_op(
    op_type: str, since: int = 1, domain: str = ""
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the handler of `op_type` from opset `since` on."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        key = (_norm_domain(domain), op_type)
        entries = HANDLERS.setdefault(key, [])
        if any(v == since for v, _ in entries):
            raise RuntimeError(f"ONNX handler for {op_type} since {since} registered twice")
        entries.append((since, fn))
        entries.sort(key=lambda e: e[0])
        return fn

    return deco


def find_handler(domain: str, op_type: str, opset: int) -> Callable[..., Any] | None:
    """The handler for `op_type` at `opset`, or None when unsupported."""
    entries = HANDLERS.get((_norm_domain(domain), op_type))
    if not entries:
        return None
    chosen = None
    for since, fn in entries:
        if since <= opset:
            chosen = fn
    return chosen


def supported_operators() -> list[tuple[str, str, int]]:
    """(domain, op_type, lowest since-version) of every supported ONNX operator, sorted."""
    out = []
    for (domain, op_type), entries in HANDLERS.items():
        out.append((domain or "ai.onnx", op_type, entries[0][0]))
    return sorted(out, key=lambda e: (e[0] != "ai.onnx", e[0], e[1]))
