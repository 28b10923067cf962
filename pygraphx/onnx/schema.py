"""What ONNX's own operator schemas say about a node, for checks the handlers need not repeat."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import onnx
from onnx.defs import OpSchema

__all__ = ["missing_required_inputs"]


@lru_cache(maxsize=1024)
def _required_positions(domain: str, op_type: str, opset: int) -> tuple[int, ...]:
    """Positions of the inputs the schema marks as single (not optional, not variadic)."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:  # a contrib or unknown operator: its handler checks
        return ()
    single = OpSchema.FormalParameterOption.Single
    return tuple(k for k, p in enumerate(schema.inputs) if p.option == single)


def missing_required_inputs(
    domain: str, op_type: str, opset: int, args: Sequence[Any]
) -> list[int]:
    """The required input positions of this node that are absent (not given, or given as the
    empty name that ONNX uses for a skipped optional input)."""
    return [
        k for k in _required_positions(domain, op_type, opset) if k >= len(args) or args[k] is None
    ]
