"""The model loader's command-line options: their definitions (`add_loader_arguments`) and
what they parse into (`parse_options`, `resolve_model_file`); `loader.py` loads the model
they name."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pygraphx.driver.calibration import FORMAT_HELP
from pygraphx.driver.errors import DriverError
from pygraphx.driver.shapes import parse_dyn_dim, parse_dyn_input_dims
from pygraphx.ir.serialize import MAGIC

DEFAULT_SEQ_LEN = 128
SAVED_SUFFIXES = (".pgx", ".mxr")  # .mxr: MIGraphX's name for a saved program
ONNX_SUFFIXES = (".onnx",)


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
        "--fp16",
        action="store_true",
        help="convert the program to half (quantize_fp16); with --int8/--fp8 the rest of the "
        "program, after quantising (as MIGraphX's driver combines them)",
    )
    precision.add_argument(
        "--bf16", action="store_true", help="convert the program to bf16 (quantize_bf16)"
    )
    calibrated = transform.add_mutually_exclusive_group()
    calibrated.add_argument(
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
        "'dot,convolution', or 'all'; default: all for --fp16, 'products' for --bf16 (the "
        "products and what computes only on their results in bf16; residual sums, "
        "normalisations and softmax in float32)",
    )
    calibrated.add_argument(
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
    transform.add_argument(
        "--residuals",
        action="store_true",
        default=None,
        help="with --int8/--fp8: quantise the residual adds' other operands too (a block's "
        "input added to its last product: TensorRT's and ONNX Runtime's placement; one more "
        "rounding, fewer bytes on the gpu)",
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


def _op_names(text: str) -> tuple[str, ...]:
    """--precision-ops' comma-separated operator names."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected operator names, e.g. 'dot,convolution'")
    return names
