"""Tests of the driver's verify command and of its comparison rules.

Commands run in-process through `main([...])` on a small ONNX model (driver_models.py,
built with tests/helpers.py `make_model`) written to `tmp_path` (the `model_path` fixture,
conftest.py).

`verify`'s per-instruction search is checked on deliberately broken candidates (driver_models.py):
a test-only pass that turns every `relu` into `abs` (before and after -O's fusion), one that
scales a literal, and a test-only target whose relu kernel is wrong; each is handed to
`verify_programs` directly, and the relu->abs one also goes through the CLI as a saved compiled
program loaded with `--migraphx`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import pygraphx
from pygraphx.driver.compare import Tolerance, compare, program_precision, tolerance_for
from pygraphx.driver.verify import verify_programs
from pygraphx.passes.pipeline import optimize
from tests.driver.driver_models import (
    SHAPE,
    BrokenReluTarget,
    X,
    drive,
    parse,
    relu_to_abs,
    scale_literal,
)


# --- verify -----------------------------------------------------------------------------------
@pytest.mark.parametrize("flags", [[], ["-O"]])
def test_verify_passes(
    capsys: pytest.CaptureFixture[str], model_path: str, flags: list[str]
) -> None:
    rc, out, err = drive(capsys, "verify", "--onnx", model_path, "--per-instruction", *flags)
    assert rc == 0, out + err
    assert re.search(r"^y: PASSED \(float_type", out, re.M)
    assert re.search(r"^z: PASSED \(float_type", out, re.M)
    assert "PASSED: all 2 outputs match the reference" in out
    assert "First diverging" not in out


def test_verify_json(capsys: pytest.CaptureFixture[str], model_path: str) -> None:
    rc, out, err = drive(capsys, "verify", "--onnx", model_path, "-O", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["passed"] is True and doc["culprit"] is None
    assert [o["name"] for o in doc["outputs"]] == ["y", "z"]
    assert all(o["passed"] and o["not_close"] == 0 for o in doc["outputs"])


def test_verify_programs_broken_pass() -> None:
    report = verify_programs(relu_to_abs(parse()), parse(), {"x": X}, per_instruction=True)
    assert not report.passed
    assert [o.passed for o in report.outputs] == [True, False]
    culprit = report.culprit
    assert culprit is not None and culprit.op == "abs" and culprit.kind == "rewrite"
    assert re.fullmatch(rf"main:@\d+ = abs\(main:@\d+\) -> {re.escape(SHAPE)}", culprit.instruction)
    text = "\n".join(report.lines())
    assert "FAILED: 1 of 2 outputs differ" in text
    assert f"First diverging instruction ({culprit.reason}):\n{culprit.instruction}" in text
    assert "is the reference's main:@" in text  # its input has a counterpart


def test_verify_programs_broken_pass_after_fusion() -> None:
    report = verify_programs(
        relu_to_abs(optimize(parse())), parse(), {"x": X}, per_instruction=True
    )
    culprit = report.culprit
    assert culprit is not None and culprit.op == "pointwise"
    assert re.fullmatch(
        r"main:@\d+ = pointwise\(main:@\d+\), \[main:pointwise\d+\] -> .*", culprit.instruction
    )
    assert re.search(r"= abs\(x0\)", culprit.body)


def test_verify_programs_broken_literal() -> None:
    candidate = scale_literal(parse())
    report = verify_programs(candidate, parse(), {"x": X}, per_instruction=True)
    assert [o.passed for o in report.outputs] == [False, False]
    culprit = report.culprit
    assert culprit is not None and culprit.kind == "rewrite"
    assert any("no counterpart (a value a pass made up?)" in d for d in culprit.details)


def test_verify_programs_broken_kernel() -> None:
    candidate = parse()
    candidate.compile(BrokenReluTarget())
    report = verify_programs(candidate, parse(), {"x": X}, per_instruction=True)
    culprit = report.culprit
    assert culprit is not None and culprit.kind == "kernel" and culprit.op == "relu"
    assert "differs from its op's reference semantics" in culprit.reason


def test_verify_without_per_instruction_names_no_culprit() -> None:
    report = verify_programs(relu_to_abs(parse()), parse(), {"x": X})
    assert not report.passed and report.culprit is None


def test_verify_cli_broken_saved_program(
    capsys: pytest.CaptureFixture[str], model_path: str, tmp_path: Path
) -> None:
    broken = relu_to_abs(parse())
    broken.compile(pygraphx.get_target("ref"))
    path = tmp_path / "broken.pgx"
    pygraphx.save(broken, path)
    argv = ["verify", "--migraphx", str(path), "--reference", model_path, "--per-instruction"]
    rc, out, err = drive(capsys, *argv)
    assert rc == 1, err
    assert re.search(r"^z: FAILED", out, re.M) and re.search(r"^y: PASSED", out, re.M)
    lines = out.splitlines()
    k = next(i for i, ln in enumerate(lines) if ln.startswith("First diverging instruction"))
    assert re.fullmatch(rf"main:@\d+ = abs\(main:@\d+\) -> {re.escape(SHAPE)}", lines[k + 1])
    rc, out, _ = drive(capsys, *argv, "--json")
    assert rc == 1 and json.loads(out)["culprit"]["op"] == "abs"
    rc, _, err = drive(capsys, "verify", "--migraphx", str(path))
    assert rc == 1 and "add --reference MODEL.onnx" in err


def test_verify_tolerance_override(
    capsys: pytest.CaptureFixture[str], model_path: str, tmp_path: Path
) -> None:
    path = tmp_path / "scaled.pgx"
    pygraphx.save(scale_literal(parse(), 1.0 + 1e-3), path)
    argv = ["verify", "--migraphx", str(path), "--reference", model_path]
    rc, out, _ = drive(capsys, *argv)
    assert rc == 1 and "rtol 0.0001" in out
    rc, out, _ = drive(capsys, *argv, "--rtol", "0.01", "--atol", "0.01")
    assert rc == 0, out
    assert "rtol 0.01, atol 0.01)" in out


# --- comparison rules -------------------------------------------------------------------------
def test_tolerances_by_type() -> None:
    ref = np.full(4, 2.0, np.float32)
    assert tolerance_for("float_type", ref) == Tolerance("elementwise", 1e-4, 2e-5)
    assert tolerance_for("double_type", ref).rtol == 1e-6
    half = tolerance_for("half_type", ref)
    assert half.mode == "rms" and half.rms == 1e-2 and half.rtol == 1e-2
    assert tolerance_for("bf16_type", ref).rms == 3e-2
    assert tolerance_for("float_type", np.zeros(3, np.float32)).atol == 1e-5  # scale 1
    assert tolerance_for("half_type", np.arange(3)).mode == "exact"
    assert tolerance_for("float_type", ref, atol=0.5) == Tolerance("elementwise", 1e-4, 0.5)


def test_compare_details() -> None:
    ref = np.array([[1.0, 2.0], [np.nan, 4.0]], np.float32)
    same = compare(ref.copy(), ref, Tolerance("elementwise", 1e-4, 1e-5))
    assert same.passed and same.not_close == 0  # nan == nan
    off = ref.copy()
    off[1, 1] = 4.5
    c = compare(off, ref, Tolerance("elementwise", 1e-4, 1e-5))
    assert not c.passed and c.not_close == 1
    assert c.worst_index == [1, 1] and c.worst_values == [4.5, 4.0]
    assert c.max_abs_error == pytest.approx(0.5) and c.max_rel_error == pytest.approx(0.125)
    ints = compare(np.array([1, 2, 4]), np.array([1, 2, 3]), Tolerance("exact"))
    assert not ints.passed and ints.worst_index == [2]
    assert not compare(np.zeros(3), np.zeros(4), Tolerance("exact")).passed


def test_program_precision() -> None:
    assert program_precision(parse()) == "float_type"
