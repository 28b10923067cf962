"""The ONNX frontend: `parse_onnx`, `parse_onnx_buffer`, and the list of supported operators."""

from __future__ import annotations

from pygraphx.onnx.api import parse_onnx, parse_onnx_buffer
from pygraphx.onnx.errors import ExternalDataError, OnnxParseError, UnsupportedOperatorError
from pygraphx.onnx.registry import supported_operators


def get_onnx_operators() -> list[str]:
    """Names of the supported ONNX operators (default domain first, then others as domain::op)."""
    return [op if dom == "ai.onnx" else f"{dom}::{op}" for dom, op, _ in supported_operators()]


__all__ = [
    "ExternalDataError",
    "OnnxParseError",
    "UnsupportedOperatorError",
    "get_onnx_operators",
    "parse_onnx",
    "parse_onnx_buffer",
]
