"""Errors of the ONNX frontend, each naming the file, node, op type, domain and opset involved."""

from __future__ import annotations


class OnnxParseError(ValueError):
    """The model cannot be turned into a program; the message says where and why."""


class UnsupportedOperatorError(OnnxParseError):
    """The model uses operators pygraphx does not support (all of them are listed at once)."""

    def __init__(self, message: str, unsupported: list[tuple[str, str, int, list[str]]]) -> None:
        super().__init__(message)
        # (domain, op_type, opset, node names)
        self.unsupported = unsupported


class ExternalDataError(OnnxParseError):
    """An initialiser's external data file is missing, unsafe or too short."""


class InputValueNeeded(OnnxParseError):
    """A shape in the model depends on the *value* of graph inputs (`inputs`): the program can
    only be built once those values are known (parse with `specialize_on_input_values=True`)."""

    def __init__(self, message: str, inputs: set[str]) -> None:
        super().__init__(message)
        self.inputs = inputs
