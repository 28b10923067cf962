"""`parse_onnx` and `parse_onnx_buffer` as users call them: every option named in the signature.

They forward to the frontend (`onnx/dynamic.py`, which handles dynamic dimensions, and
`onnx/parser.py`), so that `help(pygraphx.parse_onnx)` and the API reference show the options
instead of `**options`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pygraphx.ir.program import Program
from pygraphx.onnx import dynamic

DimSpec = Any  # an int, a (min, max[, optimals]) pair, a {"min", "max", "optimals"} dict


def _options(
    default_dim_value: int,
    map_input_dims: Mapping[str, Sequence[int]] | None,
    map_dyn_input_dims: Mapping[str, Sequence[DimSpec]] | None,
    default_dyn_dim_value: DimSpec | None,
    skip_unknown_operators: bool,
    print_program_on_error: bool,
    max_loop_iterations: int,
    specialize_on_input_values: bool,
) -> dict[str, Any]:
    options: dict[str, Any] = {
        "default_dim_value": default_dim_value,
        "skip_unknown_operators": skip_unknown_operators,
        "print_program_on_error": print_program_on_error,
        "max_loop_iterations": max_loop_iterations,
        "specialize_on_input_values": specialize_on_input_values,
    }
    for name, value in (
        ("map_input_dims", map_input_dims),
        ("map_dyn_input_dims", map_dyn_input_dims),
        ("default_dyn_dim_value", default_dyn_dim_value),
    ):
        if value is not None:
            options[name] = value
    return options


def _internal(options: dict[str, Any]) -> dict[str, Any]:
    """Options the frontend uses internally (`constant_inputs`); any other name is a typo,
    reported with the list of known options."""
    unknown = sorted(set(options) - set(dynamic.ALL_OPTIONS))
    if unknown:
        raise TypeError(f"unknown parse option(s) {unknown}; known: {dynamic.ALL_OPTIONS}")
    return options


def parse_onnx(
    path: str | Path,
    *,
    default_dim_value: int = 1,
    map_input_dims: Mapping[str, Sequence[int]] | None = None,
    map_dyn_input_dims: Mapping[str, Sequence[DimSpec]] | None = None,
    default_dyn_dim_value: DimSpec | None = None,
    skip_unknown_operators: bool = False,
    print_program_on_error: bool = False,
    max_loop_iterations: int = 10,
    specialize_on_input_values: bool = True,
    **internal: Any,
) -> Program:
    """Parse the ONNX model file at `path` into an uncompiled `Program`.

    Args:
        path: the `.onnx` file; external data files are read from its folder (and never
            from outside it).
        default_dim_value: the size given to every symbolic dimension (a `batch` or
            `sequence` axis) that no other option sets.
        map_input_dims: fixed lens per input name, e.g. `{"input": [8, 3, 224, 224]}`. For a
            dimension the model declares symbolic the value is the largest size: the program
            then runs at any size from 1 to it. A name that is not an input is an error.
        map_dyn_input_dims: ranges per input name, each dimension an int or `(min, max)` /
            `(min, max, optimals)` / `{"min": .., "max": .., "optimals": [..]}`, e.g.
            `{"input": [(1, 8), 3, 224, 224]}`. The program runs at any shape in the ranges;
            each shape is compiled once and cached.
        default_dyn_dim_value: a range for every symbolic dimension no other option sets.
        skip_unknown_operators: parse models with unsupported operators anyway (they fail
            when run); by default every unsupported operator is listed in one error.
        print_program_on_error: print the program built so far when a node fails to parse.
        max_loop_iterations: the static length of a Loop's scan outputs when the model does
            not fix it.
        specialize_on_input_values: models whose shapes depend on input *values* (a Reshape
            target fed as an input) compile per value at run time; False makes them an error.
        **internal: options the frontend passes to itself (`constant_inputs`); another name
            is a `TypeError` listing the known options.

    Returns:
        The program; compile it with `Program.compile` before running it.

    Raises:
        OnnxParseError: the file cannot be read or a node cannot be parsed (the message names
            the file, node, op type, domain and opset); `UnsupportedOperatorError` lists every
            unsupported operator.

    Example:
        >>> import pygraphx
        >>> prog = pygraphx.parse_onnx("resnet50.onnx", map_input_dims={"input": [4, 3, 224, 224]})
        >>> prog.get_inputs()["input"].lens()
        [4, 3, 224, 224]
    """
    options = _options(
        default_dim_value,
        map_input_dims,
        map_dyn_input_dims,
        default_dyn_dim_value,
        skip_unknown_operators,
        print_program_on_error,
        max_loop_iterations,
        specialize_on_input_values,
    )
    return dynamic.parse_onnx(path, **options, **_internal(internal))


def parse_onnx_buffer(
    data: bytes,
    *,
    default_dim_value: int = 1,
    map_input_dims: Mapping[str, Sequence[int]] | None = None,
    map_dyn_input_dims: Mapping[str, Sequence[DimSpec]] | None = None,
    default_dyn_dim_value: DimSpec | None = None,
    skip_unknown_operators: bool = False,
    print_program_on_error: bool = False,
    max_loop_iterations: int = 10,
    specialize_on_input_values: bool = True,
    **internal: Any,
) -> Program:
    """Parse an ONNX model held in memory (`model.SerializeToString()`), with the options of
    `parse_onnx`. External data is not allowed: a buffer has no folder to read it from.

    Example:
        >>> import onnx, pygraphx
        >>> model = onnx.load("model.onnx")
        >>> prog = pygraphx.parse_onnx_buffer(model.SerializeToString(), default_dim_value=2)
    """
    options = _options(
        default_dim_value,
        map_input_dims,
        map_dyn_input_dims,
        default_dyn_dim_value,
        skip_unknown_operators,
        print_program_on_error,
        max_loop_iterations,
        specialize_on_input_values,
    )
    return dynamic.parse_onnx_buffer(data, **options, **_internal(internal))
