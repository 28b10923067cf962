"""Tests of the `pygraphx-driver` command line (`pygraphx.driver`).

Commands run in-process through `main([...])` with stdout/stderr captured, on tiny ONNX models
written to `tmp_path`; one test runs `python -m pygraphx version` as a subprocess. They check
the MIGraphX output formats (`params` line by line), `run`'s statistics against numpy, and that
every failure is one `error: ...` message with exit status 1 (argparse usage errors: 2).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import pygraphx
from pygraphx.driver import commands
from pygraphx.driver.commands import COMMANDS, Command
from pygraphx.driver.loader import DriverError, parse_input_dims
from pygraphx.driver.main import main
from pygraphx.ir.serialize import FORMAT_VERSION

REPO = Path(__file__).resolve().parents[2]
C = np.array([0.5, -1.0, 2.0], np.float32)


# --- helpers ----------------------------------------------------------------------------------
def tiny_model() -> onnx.ModelProto:
    """x: float[N, 3]; s = x + C; outputs y = s * s and z = relu(s)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3])
    nodes = [
        helper.make_node("Add", ["x", "c"], ["s"], name="add"),
        helper.make_node("Mul", ["s", "s"], ["y"], name="square"),
        helper.make_node("Relu", ["s"], ["z"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "tiny", [x], [y, z], [numpy_helper.from_array(C, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def expected_outputs(x: np.ndarray) -> dict[str, np.ndarray]:
    s = x + C
    return {"y": s * s, "z": np.maximum(s, 0)}


@pytest.fixture
def tiny(tmp_path: Path) -> str:
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), path)
    return str(path)


def drive(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the driver in-process: (exit status, stdout, stderr)."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_error(rc: int, err: str, *fragments: str) -> None:
    """Status 1, exactly one `error:` line first, no traceback, every fragment in the message."""
    assert rc == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [k for k, line in enumerate(lines) if line.startswith("error: ")]
    assert len(errors) == 1, err
    assert "Traceback" not in err
    message = "\n".join(lines[errors[0] :])
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def parse_run_output(out: str) -> dict[str, dict[str, object]]:
    """`run`'s stdout -> {output name: {shape, min, max, mean, std, values}}."""
    results: dict[str, dict[str, object]] = {}
    current: dict[str, object] | None = None
    for line in out.splitlines():
        head = re.match(r"^(\w+): (\w+_type, \{.*\}, \{.*\})$", line)
        if head:
            current = results.setdefault(head.group(1), {"shape": head.group(2)})
            continue
        stats = re.match(r"^  min: (\S+), max: (\S+), mean: (\S+), std: (\S+)$", line)
        if stats and current is not None:
            for key, value in zip(("min", "max", "mean", "std"), stats.groups(), strict=True):
                current[key] = float(value)
            continue
        if line.startswith("  values: ") and current is not None:
            current["values"] = line[len("  values: ") :]
    return results


def values_line(arr: np.ndarray, shown: int = 5) -> str:
    flat = [f"{float(v):g}" for v in np.asarray(arr).reshape(-1)]
    if len(flat) > 2 * shown:
        flat = [*flat[:shown], "...", *flat[-shown:]]
    return ", ".join(flat)


def check_stats(got: dict[str, object], expected: np.ndarray) -> None:
    for key, fn in (("min", np.min), ("max", np.max), ("mean", np.mean), ("std", np.std)):
        assert got[key] == pytest.approx(float(fn(expected.astype(np.float64))), rel=1e-5, abs=1e-6)
    assert got["values"] == values_line(expected)


# --- read and params ------------------------------------------------------------------------
def test_params_format_matches_migraphx(capsys: pytest.CaptureFixture[str], tiny: str) -> None:
    rc, out, err = drive(capsys, "params", "--onnx", tiny)
    assert rc == 0, err
    assert out.splitlines() == [
        f"Reading: {tiny}",
        "inputs:",
        "x: float_type, {1, 3}, {3, 1}",
        "",
        "outputs:",
        "y: float_type, {1, 3}, {3, 1}",
        "z: float_type, {1, 3}, {3, 1}",
    ]
    assert "parse:" not in out and "parse:" in err  # timings go to stderr only


@pytest.mark.parametrize(
    ("options", "lens", "strides"),
    [
        (["--batch", "2"], "{2, 3}", "{3, 1}"),
        (["--default-dim-value", "5"], "{5, 3}", "{3, 1}"),
        (["--batch", "2", "--default-dim-value", "5"], "{5, 3}", "{3, 1}"),
        (["--input-dim", "@x", "4", "3"], "{4, 3}", "{3, 1}"),
        (["--batch", "7", "--input-dim", "@x", "4", "3"], "{4, 3}", "{3, 1}"),
    ],
)
def test_params_shape_options(
    capsys: pytest.CaptureFixture[str], tiny: str, options: list[str], lens: str, strides: str
) -> None:
    rc, out, err = drive(capsys, "params", "--onnx", tiny, *options)
    assert rc == 0, err
    assert f"x: float_type, {lens}, {strides}" in out.splitlines()
    assert f"y: float_type, {lens}, {strides}" in out.splitlines()


def test_params_json(capsys: pytest.CaptureFixture[str], tiny: str) -> None:
    rc, out, err = drive(capsys, "params", "--onnx", tiny, "--batch", "2", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    shape = {"type": "float_type", "lens": [2, 3], "strides": [3, 1]}
    assert doc == {"source": tiny, "inputs": {"x": shape}, "outputs": {"y": shape, "z": shape}}


def test_read_prints_program(capsys: pytest.CaptureFixture[str], tiny: str) -> None:
    rc, out, err = drive(capsys, "read", "--onnx", tiny, "--batch", "2")
    assert rc == 0, err
    lines = out.rstrip("\n").splitlines()
    assert lines[0] == f"Reading: {tiny}"
    assert lines[1] == 'module: "main"'
    assert "x = @param:x -> float_type, {2, 3}, {3, 1}" in lines
    literal = r"main:@\d+ = " + re.escape("@literal{0.5, -1, 2} -> float_type, {3}, {1}")
    add = r"main:@\d+ = add\(x,main:@\d+\) -> " + re.escape("float_type, {2, 3}, {3, 1}")
    assert any(re.fullmatch(literal, line) for line in lines)
    assert any(re.fullmatch(add, line) for line in lines)
    assert re.fullmatch(r"main:@\d+ = @return\(main:@\d+,main:@\d+\)", lines[-1])


# --- run ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("flag", "fill"), [("--fill1", 1.0), ("--fill0", 0.0)])
def test_run_fill_statistics(
    capsys: pytest.CaptureFixture[str], tiny: str, flag: str, fill: float
) -> None:
    rc, out, err = drive(capsys, "run", "--onnx", tiny, "--input-dim", "@x", "4", "3", flag)
    assert rc == 0, err
    results = parse_run_output(out)
    assert set(results) == {"y", "z"}
    expected = expected_outputs(np.full((4, 3), fill, np.float32))
    for name, value in expected.items():
        assert results[name]["shape"] == "float_type, {4, 3}, {3, 1}"
        check_stats(results[name], value)
    assert "Target: ref" in out.splitlines()
    assert re.search(r"^Run time: [\d.]+ (ms|s)$", out, re.M)


def test_run_random_inputs_are_seeded(capsys: pytest.CaptureFixture[str], tiny: str) -> None:
    rc, out, err = drive(capsys, "run", "--onnx", tiny, "--ref", "--seed", "3")
    assert rc == 0, err
    x = np.asarray(pygraphx.generate_argument(pygraphx.Shape("float_type", [1, 3]), 3))
    results = parse_run_output(out)
    for name, value in expected_outputs(x).items():
        check_stats(results[name], value)
    _, again, _ = drive(capsys, "run", "--onnx", tiny, "--seed", "3")
    strip = [ln for ln in out.splitlines() if not ln.startswith("Run time")]
    assert strip == [ln for ln in again.splitlines() if not ln.startswith("Run time")]


def test_run_unavailable_target(capsys: pytest.CaptureFixture[str], tiny: str) -> None:
    """Without a GPU, `--gpu` is an error naming what is missing (no traceback)."""
    try:
        pygraphx.get_target("gpu")
    except pygraphx.GpuUnavailableError:
        pass
    else:
        pytest.skip("this machine has a GPU")
    rc, _, err = drive(capsys, "run", "--onnx", tiny, "--gpu")
    assert_error(rc, err, "--gpu: the 'gpu' target found no usable GPU", "get_target('cpu')")


def test_run_threads(
    capsys: pytest.CaptureFixture[str], tiny: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.delenv("PGX_CPU_THREADS", raising=False)
    argv = ("run", "--onnx", tiny, "--input-dim", "@x", "4", "3", "--fill1", "--cpu")
    rc, out, err = drive(capsys, *argv, "--threads", "1")
    assert rc == 0, err
    assert "Target: cpu" in out.splitlines() and "Threads: 1" in out.splitlines()
    check_stats(parse_run_output(out)["y"], expected_outputs(np.ones((4, 3), np.float32))["y"])
    assert "PGX_CPU_THREADS" not in os.environ  # set only while loading
    rc, out, err = drive(capsys, *argv)
    assert rc == 0, err
    default = pygraphx.get_target("cpu").threads.n
    assert f"Threads: {default}" in out.splitlines()
    rc, _, err = drive(capsys, "run", "--onnx", tiny, "--ref", "--threads", "2")
    assert_error(rc, err, "--threads 2 applies to the cpu target")
    rc, _, err = drive(capsys, *argv, "--threads", "0")
    assert rc == 2 and "--threads" in err


def test_summarize_non_finite() -> None:
    arr = np.array([1.0, np.nan, np.inf, 3.0], np.float32)
    lines = commands.summarize("out", pygraphx.Argument(arr))
    assert lines == [
        "out: float_type, {4}, {1}",
        "  min: 1, max: 3, mean: 2, std: 1",
        "  non-finite: 1 nan, 1 inf (of 4 values)",
        "  values: 1, nan, inf, 3",
    ]


# --- onnx, version --------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--list", "-l"])
def test_onnx_list(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    rc, out, err = drive(capsys, "onnx", flag)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines == pygraphx.get_onnx_operators()
    assert {"Add", "Mul", "Relu"} <= set(lines)


def test_onnx_without_list_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = drive(capsys, "onnx")
    assert_error(rc, err, "--list")


def expected_version_lines() -> list[str]:
    return [
        f"pygraphx version: {pygraphx.__version__}",
        f"ONNX Opset version: {pygraphx.version.ONNX_OPSET}",
        f"Program file format version: {FORMAT_VERSION} (.pgx/.mxr)",
        f"onnx version: {onnx.__version__}",
        f"numpy version: {np.__version__}",
    ]


@pytest.mark.parametrize("argv", [["version"], ["--version"]])
def test_version(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    rc, out, _ = drive(capsys, *argv)
    assert rc == 0
    assert out.splitlines() == expected_version_lines()


def test_python_dash_m_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pygraphx", "version"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == expected_version_lines()


# --- failures -------------------------------------------------------------------------------
def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "nope.onnx"
    rc, _, err = drive(capsys, "params", "--onnx", str(path))
    assert_error(rc, err, str(path), "no such file")


def test_corrupt_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, np.uint8).tobytes())
    rc, _, err = drive(capsys, "read", "--onnx", str(path))
    assert_error(rc, err, str(path), "not a valid ONNX model")


def test_unsupported_operators_listed_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [
        helper.make_node("FooBar", ["x"], ["a"], name="foo"),
        helper.make_node("Baz", ["a"], ["b"], name="baz", domain="com.example"),
        helper.make_node("Relu", ["b"], ["y"], name="relu"),
    ]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=opsets)
    path = tmp_path / "unsupported.onnx"
    onnx.save(model, path)
    rc, _, err = drive(capsys, "params", "--onnx", str(path))
    assert_error(rc, err, "ai.onnx::FooBar (opset 17)", "com.example::Baz (opset 1)", "foo", "baz")
    assert "Relu" not in err


def test_unknown_model(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pygraphx.models")
    rc, _, err = drive(capsys, "params", "--model", "no_such_net")
    assert_error(rc, err, "unknown model 'no_such_net'", "resnet50")


@pytest.mark.parametrize(
    ("dims", "fragment"),
    [
        (["--input-dim", "1", "3"], "expected @NAME"),
        (["--input-dim", "@x"], "@x: no dimensions"),
        (["--input-dim", "@x", "4", "three"], "'three' is not an integer"),
        (["--input-dim", "@x", "0", "3"], "must be at least 1"),
        (["--input-dim", "@", "1"], "followed by an input name"),
        (["--input-dim", "@x", "1", "3", "--input-dim", "@x", "2", "3"], "given twice"),
    ],
)
def test_bad_input_dim(
    capsys: pytest.CaptureFixture[str], tiny: str, dims: list[str], fragment: str
) -> None:
    rc, _, err = drive(capsys, "params", "--onnx", tiny, *dims)
    assert_error(rc, err, "--input-dim", fragment)


def test_input_dim_naming_no_input(capsys: pytest.CaptureFixture[str], tiny: str) -> None:
    # the parser checks map_input_dims keys (the Python API gets the same error)
    rc, _, err = drive(capsys, "params", "--onnx", tiny, "--input-dim", "@q", "1", "3")
    assert_error(rc, err, "map_input_dims names ['q']", "its inputs are ['x']")


def test_input_dim_groups() -> None:
    assert parse_input_dims([["@a", "1", "2", "@b", "3"], ["@c", "4"]]) == {
        "a": [1, 2],
        "b": [3],
        "c": [4],
    }
    assert parse_input_dims(None) == {}
    with pytest.raises(DriverError):
        parse_input_dims([["@a", "-1"]])


def test_seq_len_needs_builtin_model(capsys: pytest.CaptureFixture[str], tiny: str) -> None:
    rc, _, err = drive(capsys, "params", "--onnx", tiny, "--seq-len", "8")
    assert_error(rc, err, "--seq-len", "--input-dim")


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str
) -> None:
    args = ["params", "--onnx", str(tmp_path / "nope.onnx")]
    argv = ["--debug", *args] if where == "before" else [*args, "--debug"]
    rc, _, err = drive(capsys, *argv)
    assert rc == 1
    assert "Traceback" in err and "error: " in err


def test_internal_error_is_reported(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(args: object, steps: object) -> int:
        raise TypeError("boom")

    monkeypatch.setitem(COMMANDS, "version", Command(boom, lambda p: None, "boom"))
    rc, _, err = drive(capsys, "version")
    assert_error(rc, err, "internal error: TypeError: boom", "--debug")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["params"],
        ["frobnicate"],
        ["read", "--onnx", "a.onnx", "--model", "resnet50"],
        ["params", "--onnx", "a.onnx", "--batch", "0"],
        ["run", "--onnx", "a.onnx", "--fill0", "--fill1"],
        ["run", "--onnx", "a.onnx", "--ref", "--gpu"],
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    rc, out, err = drive(capsys, *argv)
    assert rc == 2
    assert out == ""
    assert "usage:" in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = drive(capsys, "params", "--help")
    assert rc == 0
    assert "--input-dim" in out


# --- a built-in model (slow: builds ResNet-50's 25M weights) ----------------------------------
@pytest.mark.slow
def test_params_builtin_resnet50(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pygraphx.models")
    rc, out, err = drive(capsys, "params", "--model", "resnet50")
    assert rc == 0, err
    assert out.splitlines() == [
        "Reading: resnet50 (built-in model, batch=1)",
        "inputs:",
        "input: float_type, {1, 3, 224, 224}, {150528, 50176, 224, 1}",
        "",
        "outputs:",
        "output: float_type, {1, 1000}, {1000, 1}",
    ]
