"""The driver's model loader: `--onnx FILE`, `--model NAME` or `--migraphx FILE` -> a `Program`.

The options follow `migraphx-driver`'s loader:

* `--onnx FILE` parses an ONNX file; `--model NAME` builds one of the built-in models
  (`pygraphx.models`) and parses it from memory; `--migraphx FILE` loads a program saved with
  `pygraphx.save` (e.g. by `compile --binary --output FILE`), which may already be compiled;
* `--input-dim @name d1 d2 ...` (repeatable, several `@name`s may share one flag) fixes the
  lens of a named input (parse option `map_input_dims`);
* `--batch N` sets `default_dim_value` (every unknown dimension) and the built-in model's batch;
  `--default-dim-value N` sets unknown dimensions alone and wins over `--batch`;
* `--seq-len N` sets the sequence length of the built-in transformers;
* `--fp16` / `--bf16` convert the parsed program with `pygraphx.quantize_fp16` / `quantize_bf16`,
  then `-O` / `--optimize` runs the target-independent passes (`passes.pipeline.optimize`).

A saved program has fixed shapes, so `--migraphx` takes no shape option except `--batch`, which
then only states the batch size that `perf` and `time` report (it must match the program).

Errors a user can act on are raised as `DriverError`; the frontend's own errors
(`OnnxParseError`) pass through unchanged, since they already name the file, node and op.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
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
    """A parsed (and, as asked, quantized and optimised) program and where it came from."""

    program: Program
    source: str  # what `Reading:` shows
    model_name: str | None = None  # the built-in model's name (`--model`)
    model: onnx.ModelProto | None = None  # the built-in model's ONNX proto
    #: parses the model again, untransformed (no -O, no --fp16); None for `--migraphx`
    reparse: Callable[[], Program] | None = None
    transforms: tuple[str, ...] = ()  # what was applied: "fp16", "bf16", "optimize"


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
    which.add_argument(
        "--migraphx", metavar="FILE", help="a program saved by pygraphx.save / compile --binary"
    )
    transform = parser.add_argument_group("transformations")
    transform.add_argument(
        "-O",
        "--optimize",
        action="store_true",
        help="run the target-independent optimisation passes after parsing",
    )
    precision = transform.add_mutually_exclusive_group()
    precision.add_argument(
        "--fp16", action="store_true", help="convert the program to half (quantize_fp16)"
    )
    precision.add_argument(
        "--bf16", action="store_true", help="convert the program to bf16 (quantize_bf16)"
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
    if getattr(args, "migraphx", None) is not None:
        return f"{args.migraphx} (saved program)"
    sizes = f"batch={args.batch or 1}"
    if args.seq_len is not None:
        sizes += f", seq_len={args.seq_len}"
    return f"{args.model} (built-in model, {sizes})"


def _no_step(label: str) -> AbstractContextManager[Any]:
    return contextlib.nullcontext()


def load_program(args: argparse.Namespace, step: StepFn = _no_step) -> LoadedModel:
    """Load the model the command line names, then apply --fp16/--bf16 and -O in that order
    (quantize first, so the passes see the converts); `step` wraps the long steps."""
    if getattr(args, "migraphx", None) is not None:
        loaded = _load_saved(args, step)
    else:
        loaded = _parse_model(args, step)
    apply_transforms(loaded, args, step)
    return loaded


def _parse_model(args: argparse.Namespace, step: StepFn) -> LoadedModel:
    options = parse_options(args)
    source = describe_source(args)
    if args.onnx is not None:
        if args.seq_len is not None:
            raise DriverError(
                "--seq-len sets the built-in transformers' sequence length; "
                "for an ONNX file use --input-dim @NAME D1 D2 ..."
            )
        path = args.onnx
        with step("parse"):
            program = parse_onnx(path, **options)
        loaded = LoadedModel(program, source, reparse=lambda: parse_onnx(path, **options))
    else:
        model = build_model(args.model, args.batch or 1, args.seq_len or DEFAULT_SEQ_LEN, step)
        if args.skip_unknown_operators:  # skipped nodes take their output shapes from here
            with step("shape inference"):
                model = onnx.shape_inference.infer_shapes(model)
        data = model.SerializeToString()
        with step("parse"):
            program = parse_onnx_buffer(data, **options)
        loaded = LoadedModel(
            program, source, args.model, model, reparse=lambda: parse_onnx_buffer(data, **options)
        )
    check_input_dims(program, options.get("map_input_dims", {}))
    return loaded


def _load_saved(args: argparse.Namespace, step: StepFn) -> LoadedModel:
    from pygraphx.ir.serialize import SerializationError, load

    given = [
        flag
        for flag, value in (
            ("--input-dim", args.input_dim),
            ("--default-dim-value", args.default_dim_value),
            ("--seq-len", args.seq_len),
            ("--skip-unknown-operators", args.skip_unknown_operators or None),
        )
        if value is not None
    ]
    if given:
        raise DriverError(
            f"{', '.join(given)}: shape options apply to ONNX models; {args.migraphx} is a saved "
            "program whose shapes are fixed (save it again from the ONNX model with other shapes)"
        )
    with step("load"):
        try:
            program = load(args.migraphx)
        except SerializationError as exc:
            raise DriverError(str(exc)) from exc
    if args.batch is not None:
        shapes = list(program.get_parameter_shapes().items())
        if shapes and shapes[0][1].lens() and shapes[0][1].lens()[0] != args.batch:
            name, shape = shapes[0]
            raise DriverError(
                f"--batch {args.batch}: the saved program's input {name!r} has batch "
                f"{shape.lens()[0]} ({shape}); --batch only states a saved program's batch size"
            )
    return LoadedModel(program, describe_source(args))


def apply_transforms(loaded: LoadedModel, args: argparse.Namespace, step: StepFn) -> None:
    """--fp16 / --bf16, then -O, on `loaded.program` (in place); records what was done."""
    precision = "fp16" if getattr(args, "fp16", False) else None
    precision = "bf16" if getattr(args, "bf16", False) else precision
    optimize = getattr(args, "optimize", False)
    program = loaded.program
    if (precision or optimize) and program.is_compiled():
        flags = [f"--{precision}"] if precision else []
        flags += ["-O"] if optimize else []
        raise DriverError(
            f"{' and '.join(flags)}: {loaded.source} holds a program already compiled for "
            f"target {program.target.name!r}; transform the uncompiled program (from the ONNX "
            "model)"
        )
    done: list[str] = []
    if precision is not None:
        quantize = quantizer(precision)
        errors = tuple(  # QuantizeError, where pygraphx.quantize defines it: a user's error
            e for e in [getattr(sys.modules.get("pygraphx.quantize"), "QuantizeError", None)] if e
        )
        with step(f"quantize {precision}"):
            try:
                result = quantize(program)
            except errors as exc:
                raise DriverError(f"--{precision}: {exc}") from exc
        if isinstance(result, Program):  # in place, or returns the converted program
            loaded.program = program = result
        done.append(precision)
    if optimize:
        from pygraphx.passes.manager import PassError
        from pygraphx.passes.pipeline import optimize as run_optimize

        with step("optimize"):
            try:
                run_optimize(program)
            except PassError as exc:
                raise DriverError(f"-O: {exc}") from exc
        done.append("optimize")
    loaded.transforms = tuple(done)


def quantizer(precision: str) -> Callable[[Program], Any]:
    """`pygraphx.quantize.quantize_fp16` / `quantize_bf16`, imported only when asked for (the
    package's own module, not the top-level `pygraphx`, which only the API imports)."""
    name = f"quantize_{precision}"
    try:
        module = importlib.import_module("pygraphx.quantize")
    except ImportError as exc:
        raise DriverError(f"--{precision}: pygraphx.quantize cannot be imported: {exc}") from exc
    fn = getattr(module, name, None)
    if fn is None:
        raise DriverError(
            f"--{precision}: this pygraphx has no {name}() yet (pygraphx.quantize does not "
            f"provide it); run without --{precision}"
        )
    return fn


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
