"""Tests of the driver's compile / time / perf / verify commands and of PGX_TRACE_EVAL.

Commands run in-process through `main([...])` on a small ONNX model (tests/helpers.py
`make_model`) written to `tmp_path`. `verify`'s per-instruction search is checked on
deliberately broken candidates: a test-only pass that turns every `relu` into `abs` (before and
after -O's fusion), one that scales a literal, and a test-only target whose relu kernel is wrong;
each is handed to `verify_programs` directly, and the relu->abs one also goes through the CLI as
a saved compiled program loaded with `--migraphx`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

import pygraphx
from pygraphx.driver.compare import Tolerance, compare, program_precision, tolerance_for
from pygraphx.driver.loader import DriverError, quantizer
from pygraphx.driver.main import main
from pygraphx.driver.verify import verify_programs
from pygraphx.ir.program import Program
from pygraphx.ir.trace import classify
from pygraphx.ops import make_op
from pygraphx.passes.pipeline import optimize
from pygraphx.runtime.evaluator import Evaluator
from pygraphx.targets.ref.target import RefExecutable, RefTarget
from tests.helpers import make_model

C = np.array([0.5, -1.0, 2.0, -0.25], np.float32)
X = np.linspace(-1.5, 1.5, 12, dtype=np.float32).reshape(3, 4)
SHAPE = "float_type, {3, 4}, {4, 1}"
NUMBER = r"-?[\d.]+(?:e[-+]\d+)?"


# --- helpers ----------------------------------------------------------------------------------
def small_model() -> onnx.ModelProto:
    """x: float[3, 4]; s = x + C; y = s * s; z = relu(s)."""
    nodes = [
        helper.make_node("Add", ["x", "c"], ["s"]),
        helper.make_node("Mul", ["s", "s"], ["y"]),
        helper.make_node("Relu", ["s"], ["z"]),
    ]
    return make_model(nodes, {"x": X}, ["y", "z"], {"c": C})


@pytest.fixture
def model_path(tmp_path: Path) -> str:
    path = tmp_path / "small.onnx"
    onnx.save(small_model(), path)
    return str(path)


def parse() -> Program:
    return pygraphx.parse_onnx_buffer(small_model().SerializeToString())


def expected(x: np.ndarray) -> list[np.ndarray]:
    s = x + C
    return [s * s, np.maximum(s, 0)]


def drive(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def relu_to_abs(program: Program) -> Program:
    """The deliberately broken pass: every relu (in every module) becomes abs."""
    for mod in program.modules.values():
        for ins in list(mod.instructions):
            if ins.op.name == "relu":
                mod.replace_op(ins, make_op("abs"))
    return program


def scale_literal(program: Program, factor: float = 1.5) -> Program:
    """Another broken pass: the literal C is replaced by C * factor."""
    main_mod = program.get_main_module()
    lit = next(i for i in main_mod.instructions if i.is_literal() and i.shape.elements() == 4)
    new = main_mod.insert_literal(lit, np.asarray(lit.get_literal().array) * np.float32(factor))
    main_mod.replace_instruction(lit, new)
    main_mod.remove_instruction(lit)
    return program


class _BrokenReluEvaluator(Evaluator):
    def _step(self, ins: Any, params: Any, values: Any) -> np.ndarray:
        out = super()._step(ins, params, values)
        return -out if ins.op.name == "relu" else out


class BrokenReluTarget(RefTarget):
    """A test-only target whose relu kernel returns -relu(x)."""

    name = "broken_relu"

    def prepare(self, program: Program, options: dict[str, Any]) -> RefExecutable:
        exe = RefExecutable(program)
        exe.evaluator = _BrokenReluEvaluator(program.get_main_module())
        return exe


# --- compile ----------------------------------------------------------------------------------
def test_compile_prints_program(capsys: pytest.CaptureFixture[str], model_path: str) -> None:
    rc, out, err = drive(capsys, "compile", "--onnx", model_path)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[:2] == [f"Reading: {model_path}", 'module: "main"']
    assert f"x = @param:x -> {SHAPE}" in lines
    assert any(
        re.fullmatch(rf"main:@\d+ = relu\(main:@\d+\) -> {re.escape(SHAPE)}", ln) for ln in lines
    )
    assert "compile (ref)" in err


def test_compile_optimized_shows_fused_modules(
    capsys: pytest.CaptureFixture[str], model_path: str
) -> None:
    rc, out, err = drive(capsys, "compile", "--onnx", model_path, "-O")
    assert rc == 0, err
    assert re.search(r"= pointwise\(.*\), \[main:pointwise\d+\] -> ", out)
    assert re.search(r'^module: "main:pointwise\d+"$', out, re.M)


def test_compile_binary_output_round_trip(
    capsys: pytest.CaptureFixture[str], model_path: str, tmp_path: Path
) -> None:
    path = tmp_path / "small.pgx"
    rc, out, err = drive(
        capsys, "compile", "--onnx", model_path, "-O", "--binary", "--output", str(path)
    )
    assert rc == 0, err
    assert f"Wrote: {path} (saved program compiled for ref, binary" in out
    assert 'module: "main"' not in out
    loaded = pygraphx.load(path)
    assert loaded.is_compiled() and loaded.target.name == "ref"
    got = [np.array(r) for r in loaded.run({"x": X})]
    for a, b in zip(got, expected(X), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    # the driver runs it too, and shows the same program as `compile` printed
    rc, text, err = drive(capsys, "compile", "--migraphx", str(path))
    assert rc == 0, err
    assert text.splitlines()[1:] == str(loaded).splitlines()


def test_compile_text_output(
    capsys: pytest.CaptureFixture[str], model_path: str, tmp_path: Path
) -> None:
    path = tmp_path / "small.txt"
    rc, out, err = drive(capsys, "compile", "--onnx", model_path, "--output", str(path))
    assert rc == 0, err
    assert path.read_text().startswith('module: "main"\n')


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--binary"], "--binary writes the saved program to a file: add --output FILE"),
        (["--gpu"], "--gpu: the 'gpu' target found no usable GPU"),
    ],
)
def test_compile_errors(
    capsys: pytest.CaptureFixture[str], model_path: str, argv: list[str], fragment: str
) -> None:
    if "--gpu" in argv:
        try:
            pygraphx.get_target("gpu")
            pytest.skip("this machine has a GPU: compiling for gpu succeeds")
        except pygraphx.GpuUnavailableError:
            pass
    rc, _, err = drive(capsys, "compile", "--onnx", model_path, *argv)
    assert rc == 1 and fragment in err and "Traceback" not in err


# --- loader: --migraphx, -O, --fp16 -----------------------------------------------------------
def test_migraphx_loader_errors(
    capsys: pytest.CaptureFixture[str], model_path: str, tmp_path: Path
) -> None:
    path = tmp_path / "small.pgx"
    pygraphx.save(parse(), path)  # an uncompiled saved program
    rc, out, err = drive(capsys, "run", "--migraphx", str(path), "--fill1")
    assert rc == 0, err
    assert "  values: 2.25, 0, 9, 0.5625, 2.25, ..., 0.5625, 2.25, 0, 9, 0.5625" in out
    compiled = parse()
    compiled.compile(pygraphx.get_target("ref"))
    pygraphx.save(compiled, path)
    for argv, fragment in [
        (["-O"], "already compiled for target 'ref'"),
        (["--input-dim", "@x", "3", "4"], "shape options apply to ONNX models"),
        (["--batch", "2"], "--batch only states a saved program's batch size"),
    ]:
        rc, _, err = drive(capsys, "compile", "--migraphx", str(path), *argv)
        assert rc == 1 and fragment in err, err
    (tmp_path / "junk.pgx").write_bytes(b"not a program")
    rc, _, err = drive(capsys, "read", "--migraphx", str(tmp_path / "junk.pgx"))
    assert rc == 1 and "error: " in err and "not a pygraphx program" in err
    rc, _, err = drive(capsys, "read", "--migraphx", str(path), "--onnx", model_path)
    assert rc == 2 and "not allowed with" in err


def _require_quantizer(precision: str) -> None:
    try:
        quantizer(precision)
    except DriverError as exc:
        pytest.skip(f"pygraphx.quantize_{precision} is not available yet: {exc}")


@pytest.mark.parametrize(("flag", "type_name"), [("--fp16", "half_type"), ("--bf16", "bf16_type")])
def test_reduced_precision(
    capsys: pytest.CaptureFixture[str], model_path: str, flag: str, type_name: str
) -> None:
    _require_quantizer(flag[2:])
    rc, out, err = drive(capsys, "compile", "--onnx", model_path, flag, "-O")
    assert rc == 0, err
    assert type_name in out
    rc, out, err = drive(capsys, "verify", "--onnx", model_path, flag)
    assert rc == 0, out + err
    assert f"Precision: {type_name}" in out and "relative RMS error <=" in out


def test_missing_quantizer_is_a_driver_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import pygraphx.quantize as quantize_pkg

    monkeypatch.delattr(pygraphx, "quantize_fp16", raising=False)
    monkeypatch.delattr(quantize_pkg, "quantize_fp16", raising=False)
    with pytest.raises(DriverError, match="no quantize_fp16"):
        quantizer("fp16")


# --- time, perf -------------------------------------------------------------------------------
def test_time(capsys: pytest.CaptureFixture[str], model_path: str) -> None:
    rc, out, err = drive(capsys, "time", "--onnx", model_path, "-n", "3", "-O")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[1:3] == ["Allocating params ...", "Running ..."]
    assert lines[3] == "Batch size: 3 (first dimension of input 'x')"  # the true batch
    total = float(re.fullmatch(rf"Total time: ({NUMBER})ms", lines[4]).group(1))
    rate = float(re.fullmatch(rf"Rate: ({NUMBER})/sec", lines[5]).group(1))
    assert rate == pytest.approx(1000.0 / total * 3, rel=1e-4)


def parse_perf(out: str) -> dict[str, Any]:
    """perf's stdout -> instruction rows, summary rows, fused groups and the final numbers."""
    lines = out.splitlines()
    start = lines.index("Running performance report ...") + 1
    end = lines.index("Summary:")
    inst = re.compile(rf"^(.* -> .*): ({NUMBER})ms, ({NUMBER})%$")
    rows = [inst.match(ln) for ln in lines[start:end]]
    summary = []
    k = end + 1
    while lines[k]:
        m = re.fullmatch(rf"(\S+): ({NUMBER})ms / (\d+) = ({NUMBER})ms, ({NUMBER})%", lines[k])
        assert m, lines[k]
        summary.append((m.group(1), float(m.group(2)), int(m.group(3)), float(m.group(5))))
        k += 1
    assert lines[k + 1] == "Fused groups:", lines[k + 1]
    fused = []
    k += 2
    while lines[k]:
        m = re.fullmatch(rf"(\S+) \((.*)\): ({NUMBER})ms, ({NUMBER})%", lines[k])
        assert m, lines[k]
        fused.append((m.group(1), m.group(2).split(", "), float(m.group(3)), float(m.group(4))))
        k += 1
    tail = lines[k + 1 :]
    program = lines[start:end]
    while program and not program[-1]:
        program.pop()
    return {
        "program": program,
        "rows": [r for r in rows if r],
        "summary": summary,
        "fused": fused,
        "tail": tail,
    }


def test_perf_report(capsys: pytest.CaptureFixture[str], model_path: str) -> None:
    rc, out, err = drive(capsys, "perf", "--onnx", model_path, "-n", "3", "--batch", "2")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[1:4] == [
        "Allocating params ...",
        "Inputs: random (seed 0)",
        "Running performance report ...",
    ]
    report = parse_perf(out)
    assert report["program"][0] == 'module: "main"'
    assert any(ln.startswith(f"x = @param:x -> {SHAPE}: ") for ln in report["program"])
    assert any(
        re.match(r"main:@\d+ = relu\(main:@\d+\) -> .*ms, .*%$", ln) for ln in report["program"]
    )
    assert re.fullmatch(r"main:@\d+ = @return\(main:@\d+,main:@\d+\)", report["program"][-1])
    shares = [float(r.group(3)) for r in report["rows"]]
    assert len(shares) == len(report["program"]) - 2  # every instruction but module: / @return
    assert sum(shares) == pytest.approx(100.0, abs=0.01)
    summary = report["summary"]
    assert sum(s[3] for s in summary) == pytest.approx(100.0, abs=0.01)
    assert sum(s[2] for s in summary) == len(shares)
    assert [s[1] for s in summary] == sorted((s[1] for s in summary), reverse=True)
    assert {"relu", "add", "mul", "@param", "@literal"} <= {s[0] for s in summary}
    tail = report["tail"]
    labels = [ln.split(":")[0] for ln in tail]
    assert labels == [
        "Batch size",
        "Rate",
        "Total time",
        "Total instructions time",
        "Profiled run time",
        "Overhead time",
        "Overhead",
        "Run time (min / median / p90 / p99)",
    ]
    # --batch 2 cannot change the model's fixed first dimension (3): the report says 3
    assert tail[0] == "Batch size: 3 (first dimension of input 'x')"
    assert "--batch 2: the model's inputs have no symbolic dimension" in err
    first = [float(re.search(NUMBER, ln.split(":", 1)[1]).group()) for ln in tail[1:6]]
    rate, total, instructions, profiled, overhead = first
    assert rate == pytest.approx(1000.0 / total * 3, rel=1e-4)
    # every figure is measured in the runs it describes: nothing negative, and the profiled
    # run time is its instructions plus its overhead
    assert min(total, instructions, profiled, overhead) >= 0
    assert profiled == pytest.approx(instructions + overhead, rel=1e-3, abs=1e-5)
    share = int(re.fullmatch(r"Overhead: (\d+)% of the profiled run time", tail[6]).group(1))
    assert share == round(100 * overhead / profiled)
    stats = [float(v) for v in re.findall(rf"({NUMBER})ms", tail[7])]
    assert len(stats) == 4 and stats == sorted(stats)


def test_perf_json(capsys: pytest.CaptureFixture[str], model_path: str) -> None:
    rc, out, err = drive(capsys, "perf", "--onnx", model_path, "-n", "3", "-O", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["runs"] == 3 and doc["target"] == "ref" and doc["transforms"] == ["optimize"]
    assert sum(i["percent"] for i in doc["instructions"]) == pytest.approx(100.0)
    assert {i["op"] for i in doc["instructions"]} >= {"pointwise", "@param"}
    total = sum(s["time_ms"] for s in doc["summary"])
    assert total == pytest.approx(doc["total_instructions_time_ms"])
    assert doc["batch_size"] == 3 and doc["batch_size_from"] == "first dimension of input 'x'"
    assert doc["rate_per_sec"] == pytest.approx(3000.0 / doc["total_time_ms"])
    assert set(doc["run_time_ms"]) == {"min", "median", "p90", "p99"}
    overhead = doc["overhead_time_ms"]
    assert overhead >= 0
    assert doc["profiled_run_time_ms"] == pytest.approx(
        doc["total_instructions_time_ms"] + overhead, rel=1e-6
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


# --- PGX_TRACE_EVAL ---------------------------------------------------------------------------
def traced_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, level: str
) -> tuple[list[np.ndarray], list[str]]:
    program = parse()
    program.compile(pygraphx.get_target("ref"))
    capsys.readouterr()
    monkeypatch.setenv("PGX_TRACE_EVAL", level)
    results = [np.array(r) for r in program.run({"x": X})]
    return results, capsys.readouterr().out.splitlines()


def test_trace_eval_off(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, lines = traced_run(capsys, monkeypatch, "")
    assert lines == []


def test_trace_eval_1(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    results, lines = traced_run(capsys, monkeypatch, "1")
    for a, b in zip(results, expected(X), strict=True):
        np.testing.assert_allclose(a, b)
    program = parse()
    shown = str(program).splitlines()[1:-1]  # every instruction but `module:` and @return
    assert len(lines) == 2 * len(shown)
    total = 0.0
    for k, line in enumerate(shown):
        assert lines[2 * k] == f"Run instruction: {line}"
        m = re.fullmatch(rf"Time: ({NUMBER})ms, ({NUMBER})ms", lines[2 * k + 1])
        assert m, lines[2 * k + 1]
        total += float(m.group(1))
        assert float(m.group(2)) == pytest.approx(total, rel=1e-3)


def test_trace_eval_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, lines = traced_run(capsys, monkeypatch, "2")
    relu = next(
        k for k, ln in enumerate(lines) if re.match(r"Run instruction: main:@\d+ = relu", ln)
    )
    assert lines[relu + 2] == "Output has zero, normal"
    z = np.maximum(X + C, 0).reshape(-1)
    head = ", ".join(f"{v:g}" for v in z[:5])
    tail = ", ".join(f"{v:g}" for v in z[-5:])
    assert lines[relu + 3] == f"Output: {head}, ..., {tail}"
    param = lines.index(f"Run instruction: x = @param:x -> {SHAPE}")
    assert lines[param + 2].startswith("Run instruction: ")  # no Output lines for @param


def test_classify() -> None:
    assert classify(np.array([0.0, 1.0, np.inf, np.nan], np.float32)) == [
        "zero",
        "normal",
        "inf",
        "nan",
    ]
    assert classify(np.array([1e-40], np.float32)) == ["subnormal"]
    assert classify(np.array([1e-40], np.float64)) == ["normal"]
    assert classify(np.array([0, 3], np.int64)) == ["zero", "normal"]
    assert classify(np.array([True])) == ["normal"]


# --- a built-in model (slow) ------------------------------------------------------------------
@pytest.mark.slow
def test_perf_builtin_resnet50(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pygraphx.models")
    rc, out, err = drive(capsys, "perf", "--model", "resnet50", "-O", "-n", "2")
    assert rc == 0, err
    report = parse_perf(out)
    summary = {s[0]: s for s in report["summary"]}
    assert summary["convolution"][2] == 53
    assert sum(float(r.group(3)) for r in report["rows"]) == pytest.approx(100.0, abs=0.01)
    assert report["tail"][0] == "Batch size: 1 (first dimension of input 'input')"


def test_auto_target_picks_cpu_when_torch_is_installed(capsys) -> None:
    """The README's main job: `perf --model ... --auto` (gpu when torch sees one, cpu with
    torch, else ref)."""
    import importlib.util

    from pygraphx.driver.main import main as driver_main

    assert driver_main(["perf", "--model", "mobilenetv2", "-O", "--auto", "-n", "2"]) == 0
    captured = capsys.readouterr()
    expected = "cpu" if importlib.util.find_spec("torch") is not None else "ref"
    if expected == "cpu":
        import torch

        expected = "gpu" if torch.cuda.is_available() else "cpu"
    assert f"compile ({expected})" in captured.err
    assert "Summary:" in captured.out and "Rate:" in captured.out


def test_perf_lists_the_fused_groups(capsys: pytest.CaptureFixture[str], model_path: str) -> None:
    """`s = x + C` has users in two groups, so -O makes three pointwise groups: add, mul, relu;
    each is listed with its body's ops and the time of the instruction that calls it."""
    rc, out, err = drive(capsys, "perf", "--onnx", model_path, "-n", "3", "-O")
    assert rc == 0, err
    report = parse_perf(out)
    assert sorted(tuple(ops) for _, ops, _, _ in report["fused"]) == [
        ("add",),
        ("mul",),
        ("relu",),
    ]
    rows = {r.group(1).split(" = ")[0]: r for r in report["rows"]}
    calls = [r for name, r in rows.items() if "pointwise(" in r.group(1)]
    assert len(calls) == 3
    for group, _, ms, share in report["fused"]:
        (row,) = [r for r in calls if f"[{group}]" in r.group(1)]
        assert ms == pytest.approx(float(row.group(2)), rel=1e-3, abs=1e-6)
        assert share == pytest.approx(float(row.group(3)), rel=1e-3, abs=1e-6)
    rc, out, err = drive(capsys, "perf", "--onnx", model_path, "-n", "2", "-O", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    groups = doc["fused_groups"]
    assert sorted(g["ops"] for g in groups) == [["add"], ["mul"], ["relu"]]
    by_name = {i["name"]: i for i in doc["instructions"]}
    for g in groups:
        assert g["kind"] == "pointwise" and g["group"].startswith("main:pointwise")
        assert g["time_ms"] == pytest.approx(by_name[g["instruction"]]["time_ms"])
