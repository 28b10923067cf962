"""IR operators, one family per module; importing this package registers all of them.

`OPS` maps each operator name to its class and `make_op(name, **attributes)` builds one.
"""

from __future__ import annotations

import importlib
import pkgutil

from pygraphx.ops.base import OPS, Op, ShapeError, make_op, register_op

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["OPS", "Op", "ShapeError", "make_op", "register_op"]
