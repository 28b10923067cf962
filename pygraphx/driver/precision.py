"""`--fp16` / `--bf16` / `--int8` / `--fp8` of the model loader: which precision the command
line asks for (`precision_of`), the quantiser it names (`quantizer`), and for `--int8` / `--fp8`
the calibration on `--calibration`'s samples (`quantize_calibrated`); `loader.py`'s
`apply_transforms` applies them."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from pygraphx.driver.calibration import read_calibration
from pygraphx.driver.errors import DriverError
from pygraphx.driver.progress import sample_progress
from pygraphx.driver.steps import StepFn, Steps
from pygraphx.ir.program import Program

PRECISIONS = ("fp16", "bf16", "int8", "fp8")
#: the options that only --int8 / --fp8 take (argparse destinations)
CALIBRATION_FLAGS = (
    "calibration",
    "calibration_samples",
    "calibration_method",
    "keep_float",
    "smooth",
    "dynamic",
    "residuals",
)
CALIBRATED = ("int8", "fp8")


def precision_of(args: argparse.Namespace) -> str | None:
    """The precision the command line asks for: --int8 / --fp8 when given (then `also_float`
    says whether --fp16 / --bf16 converts the rest), else --fp16 / --bf16, if any; checks that
    --calibration and the other calibration options come with --int8/--fp8."""
    precision = next((p for p in CALIBRATED if getattr(args, p, False)), None)
    precision = precision or also_float(args)
    if getattr(args, "precision_ops", None) is not None and also_float(args) is None:
        raise DriverError("--precision-ops applies to --fp16 or --bf16, which were not given")
    if precision not in CALIBRATED:
        for flag in CALIBRATION_FLAGS:
            if getattr(args, flag, None) is not None:
                name = "--" + flag.replace("_", "-")
                raise DriverError(f"{name} applies to --int8 or --fp8, which were not given")
    return precision


def also_float(args: argparse.Namespace) -> str | None:
    """--fp16 / --bf16 when given (alone, or after --int8 / --fp8: the rest of the program)."""
    return next((p for p in PRECISIONS if p not in CALIBRATED and getattr(args, p, False)), None)


def convert_float(program: Program, args: argparse.Namespace, precision: str) -> Any:
    """--fp16 / --bf16 (`precision`) on `program` with --precision-ops: the quantiser's result
    (a new program or None when it converted in place)."""
    quantize = quantizer(precision)
    ops = getattr(args, "precision_ops", None)
    with quantize_errors(precision):
        return quantize(program) if ops is None else quantize(program, ops)


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
    """--calibration-method, --keep-float, --smooth, --dynamic and --residuals as `quantize_int8` /
    `quantize_fp8` options (those given)."""
    options = {
        "method": getattr(args, "calibration_method", None),
        "keep_float": getattr(args, "keep_float", None),
        "smooth": getattr(args, "smooth", None),
        "dynamic": getattr(args, "dynamic", None),
        "residuals": getattr(args, "residuals", None),
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
