"""The driver's `verify` command: does the compiled program compute what the model means?

    pygraphx-driver verify --onnx model.onnx -O --per-instruction
    pygraphx-driver verify --migraphx model.pgx --reference model.onnx
    pygraphx-driver verify model.onnx --int8 --calibration cal.npz --cpu

With `--int8` / `--fp8`, verify reports what quantisation costs instead (`quant_verify.py`).

The candidate (the program as the command line makes it: -O, --fp16/--bf16, the chosen target,
or a saved program) and the reference (the unoptimised parse of the same model, compiled for
`ref`) run on the same inputs and every output is compared. `verify_programs` does the work and
is the Python entry point (tests hand it a candidate they rewrote themselves).

How one output is judged (the tolerances per precision, `--rtol` / `--atol`, the array
comparison and its per-output `Comparison`) lives in `compare.py`; this module runs the
programs, collects the comparisons into a `VerifyReport` and searches for the culprit.

`--per-instruction`, when an output fails, names the first diverging instruction of the
candidate in two steps:
1. kernel check: every candidate instruction's op is evaluated with ref semantics (`compute`) on
   the candidate's own recorded inputs; the first whose recorded output differs is the culprit
   (a broken target kernel or executor);
2. rewrite check (every kernel agrees, so a pass changed what the program computes, and the two
   programs cannot be matched by position): a candidate value "has a counterpart" when some
   reference value of the same lens is close to it. From each failing output walk back through
   the values without a counterpart; the first such instruction in program order is the
   culprit: its inputs have counterparts, its output does not. Literals a pass made up have no
   counterpart either; they are listed as the culprit's suspect inputs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pygraphx.driver.commands import (
    Steps,
    add_input_arguments,
    add_target_arguments,
    compile_program,
    make_inputs,
)
from pygraphx.driver.compare import (
    Comparison,
    Tolerance,
    compare,
    finite_json,
    program_precision,
    tolerance_for,
)
from pygraphx.driver.loader import DriverError, add_loader_arguments, describe_source
from pygraphx.driver.quant_verify import DEFAULT_RMS_TOL, cmd_verify_quantized
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.printer import format_instruction, instruction_names, print_module
from pygraphx.ir.program import Program
from pygraphx.ir.shape import shape_of
from pygraphx.runtime.evaluator import Evaluator

SAMPLES = 64  # elements compared first when looking for a value's counterpart


class VerifyError(ValueError):
    """The two programs cannot be compared (outputs, inputs or reference target differ)."""


#: the first look at a counterpart: unrelated tensors differ by ~100% RMS, matches by ~0%
QUICK = Tolerance("rms", rms=0.5)


# --- the report -----------------------------------------------------------------------------
@dataclass
class Culprit:
    """The first candidate instruction whose output diverges, and why it is blamed."""

    name: str
    op: str
    instruction: str  # its line in the program's text format
    kind: str  # "kernel" (target result != op semantics) or "rewrite" (no reference counterpart)
    reason: str
    details: list[str] = field(default_factory=list)
    body: str = ""  # the sub-module(s) it runs (fused ops), in text format


@dataclass
class VerifyReport:
    """The result of `verify_programs`: one check per output, and the culprit if asked for."""

    precision: str
    outputs: list[Comparison]
    per_instruction: bool = False
    culprit: Culprit | None = None

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def lines(self) -> list[str]:
        out = [line for o in self.outputs for line in o.lines()]
        failed = sum(not o.passed for o in self.outputs)
        if failed:
            out.append(f"FAILED: {failed} of {len(self.outputs)} outputs differ from the reference")
        else:
            out.append(f"PASSED: all {len(self.outputs)} outputs match the reference")
        if self.culprit is not None:
            k = self.culprit
            out += ["", f"First diverging instruction ({k.reason}):", k.instruction, *k.details]
            out += ["", k.body.rstrip("\n")] if k.body else []
        elif self.per_instruction and failed:
            out += ["", "No diverging instruction found (every value has a counterpart)"]
        return out

    def to_json(self) -> dict[str, Any]:
        return finite_json(
            {
                "passed": self.passed,
                "precision": self.precision,
                "outputs": [asdict(o) for o in self.outputs],
                "culprit": asdict(self.culprit) if self.culprit else None,
            }
        )


# --- running and recording ------------------------------------------------------------------
@dataclass
class Recording:
    """One observed run: main's instructions in order and each one's value."""

    order: list[Instruction] = field(default_factory=list)
    values: dict[int, np.ndarray] = field(default_factory=dict)

    def __call__(self, ins: Instruction, value: Any, seconds: float) -> None:
        self.order.append(ins)  # copies: a target may reuse the buffers of dead values
        self.values[id(ins)] = value if ins.is_literal() else np.array(value, copy=True)


def _run(program: Program, inputs: Mapping[str, Any], record: bool) -> tuple[list, Recording]:
    rec = Recording()
    outs = program.run(inputs, observer=rec) if record else program.run(inputs)
    return [np.asarray(o) for o in outs], rec


def _ref_compute(ins: Instruction, values: Mapping[int, np.ndarray]) -> np.ndarray:
    args = [values[id(i)] for i in ins.inputs]
    if ins.module_inputs:
        return np.asarray(
            ins.op.compute_with_modules(ins.shape, args, ins.module_inputs, values, Evaluator)
        )
    return np.asarray(ins.op.compute(ins.shape, args))


def _culprit(program: Program, ins: Instruction, kind: str, reason: str) -> Culprit:
    names = instruction_names(program.get_main_module())
    body = "\n".join(print_module(m, names=names) for m in ins.module_inputs)
    line = format_instruction(ins, names)
    return Culprit(names[id(ins)], ins.op.name, line, kind, reason, body=body)


def kernel_check(
    program: Program, rec: Recording, precision: str, rtol: float | None, atol: float | None
) -> Culprit | None:
    """Step 1: the first instruction whose recorded output != its op's ref `compute` on its
    recorded inputs."""
    for ins in rec.order:
        if ins.is_param() or ins.is_literal():
            continue
        try:
            expected = _ref_compute(ins, rec.values)
        except Exception as exc:  # the ref semantics cannot run it: blame it, with the error
            k = _culprit(program, ins, "kernel", "its op's reference semantics fail on its inputs")
            k.details.append(f"  {type(exc).__name__}: {exc}")
            return k
        got = rec.values[id(ins)]
        c = compare(got, expected, tolerance_for(precision, expected, rtol, atol))
        if not c.passed:
            reason = "the target's result differs from its op's reference semantics on its inputs"
            k = _culprit(program, ins, "kernel", reason)
            k.details += c.lines()[1:]
            return k
    return None


class _Counterparts:
    """Finds, for a candidate value, a close reference value of the same lens."""

    def __init__(self, reference: Program, rec: Recording, precision: str) -> None:
        self.precision = precision
        self.names = instruction_names(reference.get_main_module())
        self.by_lens: dict[tuple[int, ...], list[tuple[Instruction, np.ndarray]]] = {}
        for ins in rec.order:
            arr = rec.values[id(ins)]
            self.by_lens.setdefault(tuple(arr.shape), []).append((ins, arr))

    def _sample(self, arr: np.ndarray) -> np.ndarray:
        picks = np.linspace(0, arr.size - 1, min(SAMPLES, arr.size)).astype(np.int64)
        return arr[np.unravel_index(picks, arr.shape)] if arr.ndim else arr.reshape(1)

    def find(self, value: np.ndarray) -> Instruction | None:
        if value.size == 0:
            return None
        sample = self._sample(value)
        for ins, arr in self.by_lens.get(tuple(value.shape), []):
            tol = tolerance_for(self.precision, arr)
            # a loose look at a few elements first, only to skip unrelated values quickly
            if tol.mode != "exact" and not compare(sample, self._sample(arr), QUICK).passed:
                continue
            if compare(value, arr, tol).passed:
                return ins
        return None


def rewrite_check(
    candidate: Program,
    reference: Program,
    cand: Recording,
    ref: Recording,
    failing: list[int],
    precision: str,
) -> Culprit | None:
    """Step 2: walk back from the failing outputs through values with no reference counterpart;
    the first such instruction in program order is the culprit."""
    parts = _Counterparts(reference, ref, precision)
    returns = candidate.get_main_module().get_returns()
    bad: dict[int, Instruction] = {}
    stack = [returns[k] for k in failing]
    forced = {id(i) for i in stack}  # a failing output is bad whatever it resembles
    while stack:
        ins = stack.pop()
        if id(ins) in bad or ins.is_param():
            continue
        if id(ins) not in forced and parts.find(cand.values[id(ins)]) is not None:
            continue
        bad[id(ins)] = ins
        stack.extend(ins.inputs)
    ordered = [i for i in cand.order if id(i) in bad]
    if not ordered:
        return None
    first = next((i for i in ordered if not i.is_literal()), ordered[0])
    reason = "its output has no counterpart in the reference run, while its inputs have one"
    k = _culprit(candidate, first, "rewrite", reason)
    names = instruction_names(candidate.get_main_module())
    for i in first.inputs:
        if id(i) in bad:
            k.details.append(f"  input {names[id(i)]}: no counterpart (a value a pass made up?)")
        elif not i.is_param():
            match = parts.find(cand.values[id(i)])
            seen = format_instruction(match, parts.names) if match else "?"
            k.details.append(f"  input {names[id(i)]} is the reference's {seen}")
    return k


# --- the entry point ------------------------------------------------------------------------
def verify_programs(
    candidate: Program,
    reference: Program,
    inputs: Mapping[str, Any],
    *,
    rtol: float | None = None,
    atol: float | None = None,
    per_instruction: bool = False,
    precision: str | None = None,
) -> VerifyReport:
    """Run `candidate` and `reference` on `inputs` and compare every output.

    Uncompiled programs are compiled for `ref` first. `inputs` are cast to each program's
    parameter types. `precision` (default: the least precise float type the candidate uses)
    picks the tolerances; `rtol`/`atol` override them (see `compare.py`'s docstring). With
    `per_instruction`, a failure also names the first diverging instruction."""
    from pygraphx.targets import get_target

    for program in (candidate, reference):
        if not program.is_compiled():
            program.compile(get_target("ref"))
    if reference.target.name != "ref":
        raise VerifyError(f"the reference must run on ref, not on {reference.target.name!r}")
    precision = precision or program_precision(candidate)
    got, cand = _run(candidate, _cast(candidate, inputs), per_instruction)
    want, ref = _run(reference, _cast(reference, inputs), per_instruction)
    names = reference.get_output_names()
    if len(got) != len(want):
        raise VerifyError(f"the candidate has {len(got)} outputs, the reference {len(want)}")
    checks = []
    for name, a, b in zip(names, got, want, strict=True):
        c = compare(a, b, tolerance_for(precision, b, rtol, atol))
        c.name, c.shape, c.reference_shape = name, str(shape_of(a)), str(shape_of(b))
        checks.append(c)
    report = VerifyReport(precision, checks, per_instruction)
    if per_instruction and not report.passed:
        failing = [k for k, c in enumerate(checks) if not c.passed]
        report.culprit = kernel_check(candidate, cand, precision, rtol, atol) or rewrite_check(
            candidate, reference, cand, ref, failing, precision
        )
    return report


def _cast(program: Program, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for name, shape in program.get_parameter_shapes().items():
        if name not in inputs:
            raise VerifyError(f"no input given for parameter {name!r} ({shape})")
        arr = np.asarray(inputs[name])
        out[name] = arr if arr.dtype == shape.dtype() else arr.astype(shape.dtype())
    return out


# --- the command ----------------------------------------------------------------------------
def verify_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `verify`."""
    add_loader_arguments(parser)
    add_target_arguments(parser)
    add_input_arguments(parser)
    check = parser.add_argument_group("verification")
    check.add_argument(
        "--reference",
        metavar="FILE",
        help="the reference model: an ONNX file or an uncompiled saved program (required with "
        "--migraphx; default: the unoptimised parse of --onnx/--model)",
    )
    check.add_argument("--rtol", type=float, help="relative tolerance (element-wise check)")
    check.add_argument("--atol", type=float, help="absolute tolerance (element-wise, unscaled)")
    check.add_argument(
        "--per-instruction",
        action="store_true",
        help="when an output differs, name the first instruction whose output diverges",
    )
    check.add_argument(
        "--rms-tol",
        type=float,
        metavar="TOL",
        help="with --int8/--fp8: the largest relative RMS error ||q - f|| / ||f|| of an output "
        "against float that passes (default "
        + ", ".join(f"{v:g} for {k}" for k, v in DEFAULT_RMS_TOL.items())
        + "); the report lists every quantised layer's SQNR, worst first",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")


def _reference(args: argparse.Namespace, loaded: Any, steps: Steps) -> Program:
    if args.reference is None:
        if loaded.reparse is None:
            raise DriverError(
                f"verify {describe_source(args)}: a saved program needs the model to compare "
                "with: add --reference MODEL.onnx"
            )
        with steps("parse reference"):
            return loaded.reparse()
    from pygraphx.ir.serialize import MAGIC, SerializationError, load
    from pygraphx.onnx import parse_onnx

    path = Path(args.reference)
    if not path.is_file():
        raise DriverError(f"--reference {path}: no such file")
    with path.open("rb") as f:
        saved = f.read(len(MAGIC)) == MAGIC
    with steps("load reference"):
        if not saved:  # parse with the candidate's input lens, so the shapes agree
            dims = {n: s.lens() for n, s in loaded.program.get_parameter_shapes().items()}
            return parse_onnx(str(path), map_input_dims=dims)
        try:
            program = load(path)
        except SerializationError as exc:
            raise DriverError(f"--reference: {exc}") from exc
    if program.is_compiled() and program.target.name != "ref":
        raise DriverError(
            f"--reference {path} is compiled for {program.target.name!r}; the reference must be "
            "an uncompiled program or one compiled for ref"
        )
    return program


def cmd_verify(args: argparse.Namespace, steps: Steps) -> int:
    """Compare the candidate's outputs with the reference's; status 1 when any differs.
    With --int8 / --fp8: the quantisation's accuracy report (`quant_verify.py`)."""
    if args.int8 or args.fp8:
        return cmd_verify_quantized(args, steps)
    if args.rms_tol is not None:
        raise DriverError("--rms-tol judges verify --int8 / --fp8; give one of them")
    text = not args.json
    if text:
        print(f"Reading: {describe_source(args)}", flush=True)
    loaded, target = compile_program(args, steps)
    reference = _reference(args, loaded, steps)
    inputs, described = make_inputs(args, loaded)
    with steps("verify"):
        try:
            report = verify_programs(
                loaded.program,
                reference,
                inputs,
                rtol=args.rtol,
                atol=args.atol,
                per_instruction=args.per_instruction,
            )
        except VerifyError as exc:
            raise DriverError(f"verify: {exc}") from exc
    applied = f" ({', '.join(loaded.transforms)})" if loaded.transforms else ""
    ref_text = args.reference or "the unoptimised parse"
    if text:
        print(f"Target: {target.name}{applied}; reference: ref on {ref_text}")
        print(f"Inputs: {described}")
        print(f"Precision: {report.precision}")
        print("\n".join(report.lines()))
    else:
        doc = {
            "source": describe_source(args),
            "target": target.name,
            "transforms": list(loaded.transforms),
            "reference": ref_text,
            "inputs": described,
            **report.to_json(),
        }
        print(json.dumps(doc, indent=2))
    return 0 if report.passed else 1
