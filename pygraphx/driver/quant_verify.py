"""`verify --int8` / `verify --fp8`: what quantisation costs in accuracy, and is it acceptable?

    pygraphx-driver verify model.onnx --int8 --calibration cal.npz --cpu
    pygraphx-driver verify model.onnx --fp8 --calibration cal.npz --calibration-samples 16 --json

The float program (the model's parse) is quantised as `run --int8` would quantise it
(calibrated on the first `--calibration-samples` samples of `--calibration` on the command's
target, or MIGraphX's default parameters with a loud warning); the float and the quantised
copies both run on that target (`pygraphx.quantize.quant_report`) over the comparison samples:
the samples of the calibration file that were held out of calibration when there are any (give
more samples than `--calibration-samples`), else the generated inputs (`--seed`, `--fill1`...).

The report: every quantised layer's output SQNR against float in dB, worst first; every output's
relative RMS error `||q - f|| / ||f||` and, for (batch, classes) outputs, the top-1 agreement.
The status is 1 when an output's relative RMS error exceeds `--rms-tol` (default 0.1 for int8,
0.15 for fp8).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from pygraphx.driver.commands import Steps, auto_target, make_inputs, resolve_target
from pygraphx.driver.compare import finite_json
from pygraphx.driver.loader import (
    CALIBRATION_FLAGS,
    DriverError,
    calibration_samples,
    describe_source,
    load_program,
    precision_of,
    progress_of_samples,
    quantize_errors,
    quantizer_options,
    quantizer_warnings,
    warn_uncalibrated,
)
from pygraphx.driver.precision import also_float, convert_float

__all__ = ["DEFAULT_RMS_TOL", "cmd_verify_quantized"]

#: the largest relative RMS error of an output that passes, per precision (--rms-tol)
DEFAULT_RMS_TOL = {"int8": 0.1, "fp8": 0.15}
#: verify's options that judge float programs, not quantised ones
FLOAT_ONLY = {"rtol": "--rtol", "atol": "--atol", "reference": "--reference"}


def _check_options(args: argparse.Namespace, precision: str) -> None:
    given = [flag for key, flag in FLOAT_ONLY.items() if getattr(args, key, None) is not None]
    given += ["--per-instruction"] if getattr(args, "per_instruction", False) else []
    if given:
        raise DriverError(
            f"{', '.join(given)}: verify --{precision} compares the quantised program with the "
            "float one on the same target and judges the outputs' relative RMS error; use "
            "--rms-tol"
        )


def _float_model(args: argparse.Namespace, precision: str, steps: Steps) -> Any:
    """The model loaded without quantisation or -O (the report applies them to copies)."""
    plain = argparse.Namespace(**vars(args))
    for key in (precision, "optimize", also_float(args)):
        if key is not None:
            setattr(plain, key, False)
    plain.precision_ops = None
    for key in CALIBRATION_FLAGS:
        setattr(plain, key, None)
    loaded = load_program(plain, steps)
    if loaded.program.is_compiled():
        raise DriverError(
            f"verify --{precision}: {loaded.source} is compiled for "
            f"{loaded.program.target.name!r}; quantisation needs the float model (the ONNX file)"
        )
    return loaded


def cmd_verify_quantized(args: argparse.Namespace, steps: Steps) -> int:
    """The `verify --int8/--fp8` command (see the module docstring)."""
    from pygraphx.quantize import quant_report

    precision = precision_of(args)
    assert precision in DEFAULT_RMS_TOL
    _check_options(args, precision)
    tol = args.rms_tol if args.rms_tol is not None else DEFAULT_RMS_TOL[precision]
    text = not args.json
    if text:
        print(f"Reading: {describe_source(args)}", flush=True)
    loaded = _float_model(args, precision, steps)
    name = args.target or "ref"
    target = resolve_target(auto_target() if name == "auto" else name, args.threads)
    calibration, held_out = calibration_samples(args, loaded.program)
    if not calibration:
        warn_uncalibrated(precision, steps)
    if held_out:
        samples, described = held_out, f"{len(held_out)} held-out samples of {args.calibration}"
    else:
        inputs, described = make_inputs(args, loaded)
        samples = [dict(inputs)]
    transform = None
    if args.optimize:
        from pygraphx.passes.pipeline import optimize as transform
    rest = also_float(args)  # --fp16 / --bf16: the rest of the quantised copy, not the float
    quant_transform = None if rest is None else (lambda p: convert_float(p, args, rest))
    label = f"calibrate {precision} and compare with float ({target.name})"
    with progress_of_samples(steps, label, calibration) as calib:
        with quantize_errors(precision), quantizer_warnings(precision, steps):
            report = quant_report(
                loaded.program,
                target,
                calib,
                samples,
                precision=precision,
                transform=transform,
                quant_transform=quant_transform,
                **quantizer_options(args),
            )
    names = loaded.program.get_output_names()
    failed = [o for o in report.outputs if not o.rel_rms <= tol]
    verdict = (
        f"FAILED: {len(failed)} of {len(report.outputs)} outputs have a relative RMS error "
        f"above {tol:g} (--rms-tol)"
        if failed
        else f"PASSED: every output's relative RMS error is at most {tol:g} (--rms-tol)"
    )
    calibrated = f"{args.calibration} ({len(calibration)} sample(s))" if calibration else "none"
    if text:
        applied = (f" + {rest}" if rest else "") + (", optimize" if args.optimize else "")
        print(f"Target: {target.name} ({precision}{applied}); calibration: {calibrated}")
        print(f"Compared on: {described}")
        print("\n".join(report.lines(names)))
        print(verdict)
    else:
        doc = {
            "source": describe_source(args),
            "target": target.name,
            "calibration": {"file": args.calibration, "samples": len(calibration)},
            "compared_on": described,
            "rms_tol": tol,
            "passed": not failed,
            "output_names": names,
            **report.to_dict(),
            "precision": precision if rest is None else f"{precision}+{rest}",
            "worst_layers": [layer.name for layer in report.worst(None)],
        }
        print(json.dumps(finite_json(doc), indent=2))
    return 1 if failed else 0
