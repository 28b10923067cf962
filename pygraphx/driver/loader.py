"""The driver's model loader: `--onnx FILE` or `--model NAME` plus shape options -> a `Program`.

The options follow `migraphx-driver`'s loader:

* `--onnx FILE` parses an ONNX file; `--model NAME` builds one of the built-in models
  (`pygraphx.models`) and parses it from memory;
* `--input-dim @name d1 d2 ...` (repeatable, several `@name`s may share one flag) fixes the
  lens of a named input (parse option `map_input_dims`);
* `--batch N` sets `default_dim_value` (every unknown dimension) and the built-in model's batch;
  `--default-dim-value N` sets unknown dimensions alone and wins over `--batch`;
* `--seq-len N` sets the sequence length of the built-in transformers.

Errors a user can act on are raised as `DriverError`; the frontend's own errors
(`OnnxParseError`) pass through unchanged, since they already name the file, node and op.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import onnx

from pygraphx.ir.program import Program
from pygraphx.onnx import parse_onnx, parse_onnx_buffer

#: `step(label)` -> a context manager around one long step (progress and timing).
StepFn = Callable[[str], AbstractContextManager[Any]]

DEFAULT_SEQ_LEN = 128


class DriverError(Exception):
    """A problem with the command line or its inputs; the message says what to change."""


@dataclass
class LoadedModel:
    """A parsed program and where it came from."""

    program: Program
    source: str  # what `Reading:` shows
    model_name: str | None = None  # the built-in model's name (`--model`)
    model: onnx.ModelProto | None = None  # the built-in model's ONNX proto


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_loader_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the model and shape options to a subcommand's parser."""
    src = parser.add_argument_group("model")
    which = src.add_mutually_exclusive_group(required=True)
    which.add_argument("--onnx", metavar="FILE", help="an ONNX model file")
    which.add_argument(
        "--model", metavar="NAME", help="a built-in model (resnet50, mobilenetv2, bert_base, ...)"
    )
    shapes = parser.add_argument_group("shapes")
    shapes.add_argument(
        "--input-dim",
        nargs="+",
        action="append",
        metavar="ARG",
        help="lens of a named input, e.g. --input-dim @input 64 3 224 224 (repeatable)",
    )
    shapes.add_argument(
        "--batch",
        type=positive_int,
        metavar="N",
        help="batch size: the value of unknown dimensions, and the built-in model's batch",
    )
    shapes.add_argument(
        "--default-dim-value",
        type=positive_int,
        metavar="N",
        help="value of unknown (symbolic) dimensions (default: --batch, else 1)",
    )
    shapes.add_argument(
        "--seq-len",
        type=positive_int,
        metavar="N",
        help=f"sequence length of the built-in transformers (default {DEFAULT_SEQ_LEN})",
    )
    shapes.add_argument(
        "--skip-unknown-operators",
        action="store_true",
        help="parse models with unsupported operators anyway (such programs cannot be run); "
        "ONNX files need inferred shapes (onnx.shape_inference), built-in models get them",
    )


def parse_input_dims(groups: Sequence[Sequence[str]] | None) -> dict[str, list[int]]:
    """`[["@x", "1", "3"], ["@y", "4"]]` -> `{"x": [1, 3], "y": [4]}` (MIGraphX's syntax)."""
    dims: dict[str, list[int]] = {}
    for group in groups or []:
        name: str | None = None
        for token in group:
            if token.startswith("@"):
                name = token[1:]
                if not name:
                    raise DriverError("--input-dim: '@' must be followed by an input name")
                if name in dims:
                    raise DriverError(f"--input-dim: input {name!r} is given twice")
                dims[name] = []
                continue
            if name is None:
                raise DriverError(
                    f"--input-dim: expected @NAME before the dimensions, got {token!r} "
                    "(e.g. --input-dim @input 1 3 224 224)"
                )
            try:
                value = int(token)
            except ValueError:
                raise DriverError(
                    f"--input-dim @{name}: dimension {token!r} is not an integer"
                ) from None
            if value < 1:
                raise DriverError(f"--input-dim @{name}: dimension {value} must be at least 1")
            dims[name].append(value)
    for name, lens in dims.items():
        if not lens:
            raise DriverError(f"--input-dim @{name}: no dimensions given")
    return dims


def parse_options(args: argparse.Namespace) -> dict[str, Any]:
    """The parse options (`parse_onnx(**options)`) that the command line asks for."""
    options: dict[str, Any] = {}
    default = args.default_dim_value or args.batch
    if default is not None:
        options["default_dim_value"] = default
    dims = parse_input_dims(args.input_dim)
    if dims:
        options["map_input_dims"] = dims
    if args.skip_unknown_operators:
        options["skip_unknown_operators"] = True
    return options


def describe_source(args: argparse.Namespace) -> str:
    """What `Reading:` prints: the file as given, or the built-in model and its sizes."""
    if args.onnx is not None:
        return args.onnx
    sizes = f"batch={args.batch or 1}"
    if args.seq_len is not None:
        sizes += f", seq_len={args.seq_len}"
    return f"{args.model} (built-in model, {sizes})"


def _no_step(label: str) -> AbstractContextManager[Any]:
    return contextlib.nullcontext()


def load_program(args: argparse.Namespace, step: StepFn = _no_step) -> LoadedModel:
    """Parse the model the command line names; `step` wraps the long steps (build, parse)."""
    options = parse_options(args)
    source = describe_source(args)
    if args.onnx is not None:
        if args.seq_len is not None:
            raise DriverError(
                "--seq-len sets the built-in transformers' sequence length; "
                "for an ONNX file use --input-dim @NAME D1 D2 ..."
            )
        with step("parse"):
            program = parse_onnx(args.onnx, **options)
        loaded = LoadedModel(program, source)
    else:
        model = build_model(args.model, args.batch or 1, args.seq_len or DEFAULT_SEQ_LEN, step)
        if args.skip_unknown_operators:  # skipped nodes take their output shapes from here
            with step("shape inference"):
                model = onnx.shape_inference.infer_shapes(model)
        with step("parse"):
            program = parse_onnx_buffer(model.SerializeToString(), **options)
        loaded = LoadedModel(program, source, args.model, model)
    check_input_dims(program, options.get("map_input_dims", {}))
    return loaded


def build_model(name: str, batch: int, seq_len: int, step: StepFn = _no_step) -> onnx.ModelProto:
    """The built-in model `name` as an ONNX proto; an unknown name lists the known ones."""
    try:
        from pygraphx import models
    except ImportError as exc:
        raise DriverError(f"built-in models are not available: {exc}") from exc
    known = models.list_models()
    key = name.strip().lower().replace("-", "_")
    if key not in known:
        raise DriverError(f"unknown model {name!r}; built-in models: {', '.join(known)}")
    with step(f"build {key}"):
        try:
            return models.get_model(key, batch=batch, seq_len=seq_len)
        except ValueError as exc:
            raise DriverError(f"cannot build model {name!r}: {exc}") from exc


def check_input_dims(program: Program, dims: dict[str, list[int]]) -> None:
    """Every `--input-dim @name` must name an input of the program."""
    inputs = program.get_parameter_names()
    unknown = [name for name in dims if name not in inputs]
    if unknown:
        listed = ", ".join(inputs) if inputs else "(none)"
        names = ", ".join(f"@{n}" for n in unknown)
        raise DriverError(f"--input-dim {names}: no such input; the model's inputs are: {listed}")
