"""Tests of the driver's compile command and of its loader's --migraphx, -O and --fp16/--bf16.

Commands run in-process through `main([...])` on a small ONNX model (driver_models.py,
built with tests/helpers.py `make_model`) written to `tmp_path` (the `model_path` fixture,
conftest.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pygraphx
from pygraphx.driver.loader import DriverError, quantizer
from tests.driver.driver_models import (
    SHAPE,
    X,
    drive,
    expected,
    parse,
)


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
    # the small model has no product, which --bf16's default ("products") would convert
    flags = (flag, "--precision-ops", "all") if flag == "--bf16" else (flag,)
    rc, out, err = drive(capsys, "compile", "--onnx", model_path, *flags, "-O")
    assert rc == 0, err
    assert type_name in out
    rc, out, err = drive(capsys, "verify", "--onnx", model_path, *flags)
    assert rc == 0, out + err
    assert f"Precision: {type_name}" in out and "relative RMS error <=" in out


def test_missing_quantizer_is_a_driver_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import pygraphx.quantize as quantize_pkg

    monkeypatch.delattr(pygraphx, "quantize_fp16", raising=False)
    monkeypatch.delattr(quantize_pkg, "quantize_fp16", raising=False)
    with pytest.raises(DriverError, match="no quantize_fp16"):
        quantizer("fp16")
