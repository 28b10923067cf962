"""The special instructions (`@param`, `@literal`, `@return`, `unknown`), re-exported from the
IR, which defines them in `pygraphx.ir.builtin_ops` (modules are built from them)."""

from __future__ import annotations

from pygraphx.ir.builtin_ops import LiteralOp, Param, Return, Unknown

__all__ = ["LiteralOp", "Param", "Return", "Unknown"]
