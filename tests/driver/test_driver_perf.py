"""Tests of the driver's time and perf commands and of PGX_TRACE_EVAL.

Commands run in-process through `main([...])` on a small ONNX model (driver_models.py,
built with tests/helpers.py `make_model`) written to `tmp_path` (the `model_path` fixture,
conftest.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

import pygraphx
from pygraphx.ir.trace import classify
from tests.driver.driver_models import (
    NUMBER,
    SHAPE,
    C,
    X,
    drive,
    expected,
    parse,
)


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
