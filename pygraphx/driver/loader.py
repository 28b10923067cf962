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
* `--fp16` / `--bf16` convert the parsed program with `pygraphx.quantize_fp16` / `quantize_bf16`;
  `--int8` / `--fp8` quantise its `dot` / `convolution` with `quantize_int8` / `quantize_fp8`,
  calibrated on the samples of `--calibration FILE.npz` (format: `calibration.py`; the first
  `--calibration-samples N`), on the command's target; without a file, MIGraphX's default
  parameters and a loud warning. Then `-O` / `--optimize` runs the target-independent passes
  (`passes.pipeline.optimize`).

A saved program has fixed shapes, so `--migraphx` takes no shape option except `--batch`, which
then only states the batch size that `perf` and `time` report (it must match the program).

Errors a user can act on are raised as `DriverError`; the frontend's own errors
(`OnnxParseError`) pass through unchanged, since they already name the file, node and op.

The options are defined and read in `loader_options.py`; the precision flags' checks, calibration
and quantiser call are in `precision.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from pygraphx.driver.errors import DriverError
from pygraphx.driver.inputs import plan_inputs
from pygraphx.driver.loader_options import (
    DEFAULT_SEQ_LEN,
    add_loader_arguments,
    parse_input_dims,
    parse_options,
    positive_int,
    resolve_model_file,
)
from pygraphx.driver.precision import (
    CALIBRATED,
    CALIBRATION_FLAGS,
    also_float,
    calibration_samples,
    convert_float,
    precision_of,
    progress_of_samples,
    quantize_calibrated,
    quantize_errors,
    quantizer,
    quantizer_options,
    quantizer_warnings,
    warn_uncalibrated,
)
from pygraphx.driver.shapes import (
    DeclaredInput,
    batch_ignored,
    check_ranks,
    declared_inputs,
    defaulted,
    symbolic_dims,
)
from pygraphx.driver.steps import StepFn
from pygraphx.ir.program import Program
from pygraphx.onnx import OnnxParseError, UnsupportedOperatorError, parse_onnx, parse_onnx_buffer
from pygraphx.onnx.parser import load_model_proto
from pygraphx.ops.base import ShapeError

#: the loader's own names, and those of loader_options.py and precision.py that other modules
#: import from here
__all__ = [
    "CALIBRATION_FLAGS",
    "DriverError",
    "LoadedModel",
    "add_loader_arguments",
    "apply_transforms",
    "build_model",
    "calibration_samples",
    "check_input_dims",
    "describe_source",
    "load_program",
    "parse_input_dims",
    "positive_int",
    "precision_of",
    "progress_of_samples",
    "quantize_errors",
    "quantizer",
    "quantizer_options",
    "quantizer_warnings",
    "resolve_model_file",
    "warn_uncalibrated",
]


@dataclass
class LoadedModel:
    """A parsed (and, as asked, quantized and optimised) program and where it came from."""

    program: Program
    source: str  # what `Reading:` shows
    model_name: str | None = None  # the built-in model's name (`--model`)
    model: onnx.ModelProto | None = None  # the built-in model's ONNX proto
    #: parses the model again, untransformed (no -O, no --fp16); None for `--migraphx`
    reparse: Callable[[], Program] | None = None
    transforms: tuple[str, ...] = ()  # what was applied: "fp16", "bf16", "int8", "optimize"
    #: the range of each input's values, read from the program before it was compiled
    input_plans: dict[str, Any] | None = None


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
    # what consumes each input, read before -O fuses or a target lowers the consumers
    loaded.input_plans = plan_inputs(loaded.program)
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
        declared = _declared_inputs_of_file(path)
        _check_shape_options(args, declared, options)

        def parse() -> Program:
            return parse_onnx(path, **options)

        model = None
    else:
        model = build_model(args.model, args.batch or 1, args.seq_len or DEFAULT_SEQ_LEN, step)
        if args.skip_unknown_operators:  # skipped nodes take their output shapes from here
            with step("shape inference"):
                model = onnx.shape_inference.infer_shapes(model)
        data = model.SerializeToString()
        declared = declared_inputs(model)
        check_ranks(declared, options.get("map_input_dims") or {}, "--input-dim")

        def parse() -> Program:
            return parse_onnx_buffer(data, **options)

    symbols = symbolic_dims(declared, options)
    if symbols:
        print(f"Symbolic dimensions: {', '.join(symbols)}", file=sys.stderr, flush=True)
    with step("parse"):
        program = _parse_explained(parse, defaulted(symbols))
    check_input_dims(program, options.get("map_input_dims", {}))
    return LoadedModel(program, source, args.model, model, reparse=parse)


def _declared_inputs_of_file(path: str) -> list[DeclaredInput]:
    """The ONNX file's declared inputs; none when it cannot be read or is no regular file (a
    device such as /dev/zero never ends): the parse then says why."""
    if not Path(path).is_file():
        return []
    try:
        data = Path(path).read_bytes()
    except OSError:
        return []
    return declared_inputs(load_model_proto(data, path))


def _check_shape_options(
    args: argparse.Namespace, declared: list[DeclaredInput], options: dict[str, Any]
) -> None:
    """Ranks of --input-dim / --dyn-input-dim, and a warning when --batch changes nothing."""
    check_ranks(declared, options.get("map_input_dims") or {}, "--input-dim")
    check_ranks(declared, options.get("map_dyn_input_dims") or {}, "--dyn-input-dim")
    if args.batch is not None and args.default_dim_value is None:
        warning = batch_ignored(declared, options)
        if warning is not None:
            print(f"warning: --batch {args.batch}: {warning}", file=sys.stderr, flush=True)


def _parse_explained(parse: Callable[[], Program], defaulted_dims: list[str]) -> Program:
    """`parse()`, with the command-line spelling in the unsupported-operator hint, and shape
    errors noting which symbolic dimensions took a default value."""
    try:
        return parse()
    except UnsupportedOperatorError as exc:
        text = str(exc).replace(
            "skip_unknown_operators=True parses anyway", "--skip-unknown-operators parses anyway"
        )
        raise DriverError(text) from exc
    except (OnnxParseError, ShapeError) as exc:
        if not defaulted_dims:
            raise
        raise DriverError(
            f"{exc}\n(note: symbolic dimensions were defaulted: {', '.join(defaulted_dims)}; "
            "set them with --input-dim @NAME D1 D2 ..., --batch N or --dyn-input-dim)"
        ) from exc


def _load_saved(args: argparse.Namespace, step: StepFn) -> LoadedModel:
    from pygraphx.ir.serialize import SerializationError, load

    given = [
        flag
        for flag, value in (
            ("--input-dim", args.input_dim),
            ("--dyn-input-dim", getattr(args, "dyn_input_dim", None)),
            ("--default-dyn-dim-value", getattr(args, "default_dyn_dim_value", None)),
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
            raise DriverError(f"{exc}{_text_file_hint(args.migraphx, exc)}") from exc
    if args.batch is not None:
        shapes = list(program.get_parameter_shapes().items())
        if shapes and shapes[0][1].lens() and shapes[0][1].lens()[0] != args.batch:
            name, shape = shapes[0]
            raise DriverError(
                f"--batch {args.batch}: the saved program's input {name!r} has batch "
                f"{shape.lens()[0]} ({shape}); --batch only states a saved program's batch size"
            )
    return LoadedModel(program, describe_source(args))


def _text_file_hint(path: str, exc: Exception) -> str:
    """For a file that is not a saved program: how to write one (text files cannot be loaded)."""
    if "bad magic number" not in str(exc):
        return ""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return ""
    kind = "the program's text" if head.lstrip().startswith((b"module:", b"{")) else "not one"
    return (
        f"; it looks like {kind}: a saved program is written by `compile --binary --output F` "
        f"or an output named .pgx/.mxr (text files from .txt/.json outputs cannot be loaded), "
        "and an ONNX model is read with --onnx or a .onnx name"
    )


def apply_transforms(loaded: LoadedModel, args: argparse.Namespace, step: StepFn) -> None:
    """--fp16 / --bf16 / --int8 / --fp8, then -O, on `loaded.program` (in place); records
    what was done."""
    precision = precision_of(args)
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
    if precision in CALIBRATED:
        quantize_calibrated(program, args, precision, step)
        done.append(precision)
    rest = also_float(args)
    if rest is not None:  # alone, or the rest of an int8 / fp8 program
        with step(f"quantize {rest}"):
            result = convert_float(program, args, rest)
        if isinstance(result, Program):  # in place, or returns the converted program
            loaded.program = program = result
        done.append(rest)
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
