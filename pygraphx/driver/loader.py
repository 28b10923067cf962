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
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from pygraphx.driver.calibration import FORMAT_HELP, read_calibration
from pygraphx.driver.errors import DriverError
from pygraphx.driver.inputs import plan_inputs
from pygraphx.driver.progress import sample_progress
from pygraphx.driver.shapes import (
    DeclaredInput,
    batch_ignored,
    check_ranks,
    declared_inputs,
    defaulted,
    parse_dyn_dim,
    parse_dyn_input_dims,
    symbolic_dims,
)
from pygraphx.driver.steps import Steps
from pygraphx.ir.program import Program
from pygraphx.ir.serialize import MAGIC
from pygraphx.onnx import OnnxParseError, UnsupportedOperatorError, parse_onnx, parse_onnx_buffer
from pygraphx.onnx.parser import load_model_proto
from pygraphx.ops.base import ShapeError

#: `step(label)` -> a context manager around one long step (progress and timing).
StepFn = Callable[[str], AbstractContextManager[Any]]

DEFAULT_SEQ_LEN = 128
SAVED_SUFFIXES = (".pgx", ".mxr")  # .mxr: MIGraphX's name for a saved program
ONNX_SUFFIXES = (".onnx",)


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
    src = parser.add_argument_group("model (a FILE, or one of --onnx, --model, --migraphx)")
    src.add_argument(
        "file",
        nargs="?",
        metavar="FILE",
        help="the model file, its format from the extension: .onnx an ONNX model, .pgx/.mxr a "
        "saved program (other names: read as a saved program when they start like one)",
    )
    which = src.add_mutually_exclusive_group()
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
    precision.add_argument(
        "--int8",
        action="store_true",
        help="quantise dot/convolution to int8 (quantize_int8), calibrated with --calibration",
    )
    transform.add_argument(
        "--precision-ops",
        metavar="OP[,OP...]",
        type=_op_names,
        default=None,
        help="with --fp16/--bf16: convert only these operators (ins_names), e.g. 'dot' or "
        "'dot,convolution': the products in low precision, the rest (residual sums, "
        "normalisations) in float32; default all",
    )
    precision.add_argument(
        "--fp8",
        action="store_true",
        help="quantise dot/convolution to fp8 e4m3 (quantize_fp8), calibrated with --calibration",
    )
    transform.add_argument(
        "--calibration",
        metavar="FILE.npz",
        help=f"calibration samples for --int8/--fp8: {FORMAT_HELP}; without it MIGraphX's "
        "default parameters are used, which can lose much accuracy",
    )
    transform.add_argument(
        "--calibration-samples",
        type=positive_int,
        metavar="N",
        help="calibrate on the first N samples of --calibration (default: all of them); verify "
        "--int8/--fp8 compares on the rest",
    )
    transform.add_argument(
        "--calibration-method",
        choices=("max", "percentile"),
        help="with --int8/--fp8: the activations' statistic, max |x| (default) or the "
        "99.99th percentile of |x|",
    )
    transform.add_argument(
        "--keep-float",
        type=positive_int,
        metavar="N",
        help="with --int8/--fp8: leave the N dot/convolution whose inputs are most peaked "
        "(max|x| / rms(x) over the calibration) in float; helps transformers' feed-forward layers",
    )
    transform.add_argument(
        "--smooth",
        type=float,
        metavar="ALPHA",
        help="with --int8/--fp8: smooth activation outliers into the weights (SmoothQuant, "
        "alpha in [0, 1], e.g. 0.5)",
    )
    transform.add_argument(
        "--dynamic",
        action="store_true",
        default=None,
        help="with --int8/--fp8: the dots' activations take per-row scales computed at run "
        "time (per token; recommended for transformers); convolutions stay calibrated",
    )
    add_shape_arguments(parser)


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The shape options: fixed and dynamic lens, batch, symbolic dimensions' values."""
    shapes = parser.add_argument_group("shapes")
    shapes.add_argument(
        "--input-dim",
        nargs="+",
        action="append",
        metavar="ARG",
        help="lens of a named input, e.g. --input-dim @input 64 3 224 224 (repeatable)",
    )
    shapes.add_argument(
        "--dyn-input-dim",
        nargs="+",
        action="append",
        metavar="ARG",
        help="dynamic lens of a named input: each an integer or a range min:max[:optimal...] "
        "(or '{min,max}', quoted), e.g. --dyn-input-dim @input 1:8 3 224 224; the program "
        "then runs at any size in the ranges",
    )
    shapes.add_argument(
        "--default-dyn-dim-value",
        metavar="DIM",
        help="make every symbolic dimension a range: min:max[:optimal...] (or '{min,max}')",
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
    dyn = parse_dyn_input_dims(getattr(args, "dyn_input_dim", None))
    if dyn:
        options["map_dyn_input_dims"] = dyn
    if getattr(args, "default_dyn_dim_value", None) is not None:
        value = parse_dyn_dim(args.default_dyn_dim_value, "--default-dyn-dim-value")
        options["default_dyn_dim_value"] = value
    if args.skip_unknown_operators:
        options["skip_unknown_operators"] = True
    return options


def resolve_model_file(args: argparse.Namespace) -> None:
    """Turn the positional FILE into `args.onnx` or `args.migraphx` (by its extension, else by
    its first bytes); exactly one way of naming the model must be given."""
    given = [f"--{f}" for f in ("onnx", "model", "migraphx") if getattr(args, f, None)]
    file = getattr(args, "file", None)
    if file is None:
        if not given:
            raise DriverError(
                "give the model: a FILE (model.onnx, or model.pgx / model.mxr saved by "
                "compile), --onnx FILE, --model NAME (built-in) or --migraphx FILE"
            )
        return
    if given:
        raise DriverError(f"the model is given twice: {file} and {given[0]}; give one")
    suffix = Path(file).suffix.lower()
    if suffix in SAVED_SUFFIXES or (suffix not in ONNX_SUFFIXES and _starts_saved(file)):
        args.migraphx = file
    else:
        args.onnx = file


def _starts_saved(path: str) -> bool:
    if not Path(path).is_file():  # a device or pipe could block or never end: the load says so
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


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


PRECISIONS = ("fp16", "bf16", "int8", "fp8")
#: the options that only --int8 / --fp8 take (argparse destinations)
CALIBRATION_FLAGS = (
    "calibration",
    "calibration_samples",
    "calibration_method",
    "keep_float",
    "smooth",
    "dynamic",
)
CALIBRATED = ("int8", "fp8")


def precision_of(args: argparse.Namespace) -> str | None:
    """The precision flag given (--fp16/--bf16/--int8/--fp8), if any; checks that
    --calibration and --calibration-samples come with --int8/--fp8."""
    precision = next((p for p in PRECISIONS if getattr(args, p, False)), None)
    if getattr(args, "precision_ops", None) is not None and precision not in ("fp16", "bf16"):
        raise DriverError("--precision-ops applies to --fp16 or --bf16, which were not given")
    if precision not in CALIBRATED:
        for flag in CALIBRATION_FLAGS:
            if getattr(args, flag, None) is not None:
                name = "--" + flag.replace("_", "-")
                raise DriverError(f"{name} applies to --int8 or --fp8, which were not given")
    return precision


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
    elif precision is not None:
        quantize = quantizer(precision)
        ops = getattr(args, "precision_ops", None)
        with step(f"quantize {precision}"), quantize_errors(precision):
            result = quantize(program) if ops is None else quantize(program, ops)
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


@contextlib.contextmanager
def quantize_errors(precision: str) -> Any:
    """QuantizeError (where pygraphx.quantize defines it) as a DriverError naming the flag."""
    errors = tuple(
        e for e in [getattr(sys.modules.get("pygraphx.quantize"), "QuantizeError", None)] if e
    )
    try:
        yield
    except errors as exc:
        raise DriverError(f"--{precision}: {exc}") from exc


def calibration_samples(
    args: argparse.Namespace, program: Program
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the samples to calibrate on, the held-out rest) from --calibration (both empty
    without it); --calibration-samples N takes the first N."""
    path = getattr(args, "calibration", None)
    if path is None:
        return [], []
    samples = read_calibration(path, program.get_parameter_shapes())
    wanted = getattr(args, "calibration_samples", None)
    if wanted is not None and wanted > len(samples):
        raise DriverError(
            f"--calibration-samples {wanted}: {path} holds only {len(samples)} sample(s)"
        )
    n = len(samples) if wanted is None else wanted
    return samples[:n], samples[n:]


def calibration_target(args: argparse.Namespace) -> Any:
    """The target the calibration runs on: the command's (--ref/--cpu/--gpu; ref by default,
    cpu for --auto when torch is installed), with --threads."""
    from pygraphx.targets import get_target
    from pygraphx.targets.gpu import GpuUnavailableError

    name = getattr(args, "target", None) or "ref"
    if name == "auto":
        name = "cpu" if importlib.util.find_spec("torch") is not None else "ref"
    threads = getattr(args, "threads", None) if name == "cpu" else None
    try:
        return get_target(name, threads=threads) if threads is not None else get_target(name)
    except (ValueError, GpuUnavailableError) as exc:
        raise DriverError(f"calibration on target {name!r}: {exc}") from None


def warn_uncalibrated(precision: str, step: StepFn) -> None:
    """The loud warning of --int8/--fp8 without --calibration."""
    text = (
        f"WARNING: --{precision} without --calibration: using MIGraphX's default {precision} "
        "parameters (activation step 1/64), so larger activations saturate and ACCURACY MAY BE "
        "LOST BADLY. Give --calibration FILE.npz with samples of real inputs."
    )
    _say(text, step, "bold red")


def quantize_calibrated(
    program: Program, args: argparse.Namespace, precision: str, step: StepFn
) -> None:
    """--int8 / --fp8: calibrate on --calibration's samples (a bar per sample on a terminal)
    and quantise `program` in place."""
    quantize = quantizer(precision)
    samples, _ = calibration_samples(args, program)
    if not samples:
        warn_uncalibrated(precision, step)
    target = calibration_target(args)
    label = f"calibrate and quantize {precision} ({target.name})"
    with progress_of_samples(step, label, samples) as samples:
        with quantize_errors(precision), quantizer_warnings(precision, step):
            quantize(program, target, samples, **quantizer_options(args))


def quantizer_options(args: argparse.Namespace) -> dict[str, Any]:
    """--calibration-method, --keep-float, --smooth and --dynamic as `quantize_int8` /
    `quantize_fp8` options (those given)."""
    options = {
        "method": getattr(args, "calibration_method", None),
        "keep_float": getattr(args, "keep_float", None),
        "smooth": getattr(args, "smooth", None),
        "dynamic": getattr(args, "dynamic", None),
    }
    return {k: v for k, v in options.items() if v is not None}


@contextlib.contextmanager
def progress_of_samples(step: StepFn, label: str, samples: list[Any]) -> Any:
    """`step(label)`, with a bar per sample on a terminal; yields the samples to loop over."""
    if isinstance(step, Steps) and samples:
        with sample_progress(step, label, samples) as wrapped:
            yield wrapped
    else:
        with step(label):
            yield samples


@contextlib.contextmanager
def quantizer_warnings(precision: str, step: StepFn) -> Any:
    """The quantiser's warnings as one plain `warning:` line each on stderr (the uncalibrated
    one is left out: `warn_uncalibrated` says it louder)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for warning in caught:
        text = str(warning.message)
        if not text.startswith(f"quantize_{precision}: no calibration"):
            _say(f"warning: {text}", step)


def _say(text: str, step: StepFn, style: str = "yellow") -> None:
    """A line on stderr (through the steps' console when there is one)."""
    if isinstance(step, Steps):
        step.console.print(text, style=style, highlight=False)
    else:
        print(text, file=sys.stderr, flush=True)


def _op_names(text: str) -> tuple[str, ...]:
    """--precision-ops' comma-separated operator names."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected operator names, e.g. 'dot,convolution'")
    return names


def quantizer(precision: str) -> Callable[..., Any]:
    """`pygraphx.quantize.quantize_<precision>` (fp16, bf16, int8, fp8), imported only when
    asked for (the package's own module, not the top-level `pygraphx`, which only the API
    imports)."""
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
