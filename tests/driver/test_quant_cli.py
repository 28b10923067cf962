"""`--int8` / `--fp8` with `--calibration FILE.npz` through the real `pygraphx-driver` entry
point (a subprocess), and `verify --int8 --json`: results checked against ONNX Runtime's float
outputs, errors checked for naming the file and the input.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import pygraphx
from tests.driver.test_cli import cli, cnn_model

RNG = np.random.default_rng(12)
SHAPE = (2, 3, 16, 16)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """model.onnx (the small CNN at batch 2), cal.npz (6 samples, stacked) and cal_k.npz (the
    same samples as input_0 ... input_5)."""
    path = tmp_path_factory.mktemp("quant")
    onnx.save(cnn_model(2), path / "model.onnx")
    samples = RNG.standard_normal((6, *SHAPE)).astype(np.float32)
    np.savez(path / "cal.npz", input=samples)
    np.savez(path / "cal_k.npz", **{f"input_{k}": s for k, s in enumerate(samples)})
    return path


def ort_float(folder: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


def rel_rms(q: np.ndarray, f: np.ndarray) -> float:
    return float(np.linalg.norm(q - f) / np.linalg.norm(f))


@pytest.mark.parametrize("cal", ["cal.npz", "cal_k.npz"])
def test_compile_int8_with_calibration_writes_an_int8_program(folder: Path, cal: str) -> None:
    out = folder / f"m_{cal}.pgx"
    proc = cli("compile", "model.onnx", "--int8", "--calibration", cal, "-o", out.name, cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert "calibrate and quantize int8 (ref)" in proc.stderr
    assert "WARNING" not in proc.stderr
    prog = pygraphx.load(out)
    ops = {ins.op.name for ins in prog.get_main_module().instructions}
    assert {"quant_convolution", "quant_dot"} <= ops and "convolution" not in ops
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    got = np.asarray(prog.run({"input": x})[0])
    assert 0.0 < rel_rms(got, ort_float(folder, x)) < 0.05  # int8, not float, not garbage


def test_verify_int8_json_matches_an_independent_measurement(folder: Path) -> None:
    proc = cli(
        "verify", "model.onnx", "--int8", "--calibration", "cal.npz", "--calibration-samples",
        "4", "--json", cwd=folder,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["precision"] == "int8" and doc["passed"] is True and doc["rms_tol"] == 0.1
    assert doc["calibration"]["samples"] == 4 and doc["samples"] == 2
    assert doc["compared_on"] == "2 held-out samples of cal.npz"
    layers = {layer["name"]: layer["sqnr_db"] for layer in doc["layers"]}
    assert [layer["op"] for layer in doc["layers"]] == ["convolution", "dot"]
    assert doc["worst_layers"] == sorted(layers, key=layers.__getitem__)
    # the same quantisation (first 4 samples) compiled separately, on the 2 held-out samples
    proc = cli("compile", "model.onnx", "--int8", "--calibration", "cal.npz",
               "--calibration-samples", "4", "-o", "m4.pgx", cwd=folder)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prog = pygraphx.load(folder / "m4.pgx")
    held = np.load(folder / "cal.npz")["input"][4:]
    q = np.stack([np.asarray(prog.run({"input": x})[0]) for x in held])
    f = np.stack([ort_float(folder, x) for x in held])
    (out,) = doc["outputs"]
    assert out["rel_rms"] == pytest.approx(rel_rms(q, f), rel=1e-3)
    assert out["top1_agreement"] == pytest.approx(float(np.mean(q.argmax(-1) == f.argmax(-1))))


def test_verify_int8_text_and_threshold(folder: Path) -> None:
    ok = cli("verify", "model.onnx", "--int8", "--calibration", "cal.npz", cwd=folder)
    assert ok.returncode == 0, ok.stderr
    assert "Quantised layers, worst first" in ok.stdout and "dB  main:@" in ok.stdout
    assert "PASSED" in ok.stdout
    bad = cli("verify", "model.onnx", "--int8", "--calibration", "cal.npz", "--rms-tol", "1e-9",
              cwd=folder)  # fmt: skip
    assert bad.returncode == 1 and "FAILED: 1 of 1 outputs" in bad.stdout


def test_fp8_on_cpu_says_the_products_run_in_float(folder: Path) -> None:
    proc = cli("verify", "model.onnx", "--fp8", "--calibration", "cal.npz", "--cpu", "--json",
               cwd=folder)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("no fp8 GEMM kernel") == 1
    doc = json.loads(proc.stdout)
    assert doc["precision"] == "fp8" and doc["rms_tol"] == 0.15
    assert 0.0 < doc["outputs"][0]["rel_rms"] < 0.15


def test_int8_without_calibration_warns_loudly(folder: Path) -> None:
    proc = cli("run", "model.onnx", "--int8", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: --int8 without --calibration" in proc.stderr
    assert "ACCURACY MAY BE LOST" in proc.stderr
    assert proc.stderr.count("no calibration") == 0  # the library's own note is not repeated


def test_calibration_errors_name_the_file_and_the_input(folder: Path) -> None:
    np.savez(folder / "typo.npz", inptu=np.zeros((2, *SHAPE), np.float32))
    np.savez(folder / "shape.npz", input=np.zeros((2, 3, 16, 16), np.float32)[None, :, :1])
    (folder / "text.npz").write_text("not a zip file")
    cases = [
        ("missing.npz", "--calibration missing.npz: no such file"),
        ("typo.npz", "--calibration typo.npz: input 'input': no samples"),
        ("shape.npz", "--calibration shape.npz: input 'input': array of shape (1, 2, 1, 16, 16)"),
        ("text.npz", "--calibration text.npz: cannot be read as a .npz file"),
    ]
    for name, message in cases:
        proc = cli("compile", "model.onnx", "--int8", "--calibration", name, "-o", "x.pgx",
                   cwd=folder)  # fmt: skip
        assert proc.returncode == 1, (name, proc.stderr)
        assert message in proc.stderr, (name, proc.stderr)
        assert "internal error" not in proc.stderr
    proc = cli("run", "model.onnx", "--calibration", "cal.npz", cwd=folder)
    assert proc.returncode == 1 and "--calibration applies to --int8 or --fp8" in proc.stderr


def test_help_documents_the_calibration_format() -> None:
    proc = cli("compile", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "--int8" in text and "--fp8" in text and "--calibration-samples" in text
    assert "INPUT_0, INPUT_1" in text and "leading sample axis" in text


def test_sample_progress_bar_on_a_terminal_and_plain_when_piped() -> None:
    import io

    from rich.console import Console

    from pygraphx.driver.progress import sample_progress
    from pygraphx.driver.steps import Steps

    for terminal in (True, False):
        buf = io.StringIO()
        steps = Steps(Console(file=buf, force_terminal=terminal, width=100))
        seen = []
        with sample_progress(steps, "calibrate", [10, 20, 30]) as samples:
            assert len(samples) == 3
            seen.extend(samples)
        assert seen == [10, 20, 30] and "calibrate" in steps.times
        text = buf.getvalue()
        assert ("3/3" in text) == terminal  # the bar's count, only on a terminal
        assert "calibrate: " in text


def test_calibration_options_reach_the_quantiser(folder: Path) -> None:
    proc = cli("compile", "model.onnx", "--int8", "--calibration", "cal.npz", "--keep-float",
               "1", "-o", "k.pgx", cwd=folder)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ops = [i.op.name for i in pygraphx.load(folder / "k.pgx").get_main_module().instructions]
    assert ops.count("quant_convolution") + ops.count("quant_dot") == 1  # one layer kept float
    proc = cli("verify", "model.onnx", "--int8", "--calibration", "cal.npz", "--smooth", "0.5",
               "--calibration-method", "percentile", cwd=folder)  # fmt: skip
    assert proc.returncode == 1
    assert "error: --int8: quantize_int8: smoothing works with method='max'" in proc.stderr
    proc = cli("verify", "model.onnx", "--int8", "--calibration", "cal.npz", "--keep-float",
               "1", "--json", cwd=folder)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(layer["quantized"] for layer in json.loads(proc.stdout)["layers"]) == [
        False,
        True,
    ]


def test_dynamic_gives_the_dots_run_time_scales(folder: Path) -> None:
    proc = cli("compile", "model.onnx", "--int8", "--calibration", "cal.npz", "--dynamic",
               "-o", "d.pgx", cwd=folder)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prog = pygraphx.load(folder / "d.pgx")
    ops = [i.op.name for i in prog.get_main_module().instructions]
    assert "quant_dot" in ops and "quant_convolution" in ops and "reduce_max" in ops
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    assert 0.0 < rel_rms(np.asarray(prog.run({"input": x})[0]), ort_float(folder, x)) < 0.05
    proc = cli("compile", "model.onnx", "--dynamic", cwd=folder)
    assert proc.returncode != 0 and "--dynamic applies to --int8 or --fp8" in proc.stderr


def test_residuals_flag_reaches_the_quantiser(folder: Path) -> None:
    """--residuals is passed on (the small CNN has no residual add, so the program is the one
    without it) and, like the other calibration options, needs --int8 or --fp8."""
    proc = cli("compile", "model.onnx", "--int8", "--calibration", "cal.npz", "--residuals",
               "-o", "r.pgx", cwd=folder)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ops = [i.op.name for i in pygraphx.load(folder / "r.pgx").get_main_module().instructions]
    assert "quant_convolution" in ops
    proc = cli("verify", "model.onnx", "--int8", "--calibration", "cal.npz", "--residuals",
               "--json", cwd=folder)  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # the report quantises with it too
    assert json.loads(proc.stdout)["outputs"], proc.stdout
    proc = cli("compile", "model.onnx", "--residuals", cwd=folder)
    assert proc.returncode != 0 and "--residuals applies to --int8 or --fp8" in proc.stderr
    proc = cli("compile", "model.onnx", "--int8", "--calibration", "cal.npz", "--residuals",
               "--dynamic", cwd=folder)  # fmt: skip
    assert proc.returncode != 0 and "residuals=True needs static scales" in proc.stderr


def test_int8_with_fp16_converts_the_rest_to_half(folder: Path) -> None:
    """--int8 --fp16 (as MIGraphX's driver combines them): int8 products, the rest in half;
    verify compares that program with float32; two float or two calibrated flags are refused."""
    proc = cli("compile", "model.onnx", "--int8", "--fp16", "--calibration", "cal.npz",
               "-o", "h.pgx", cwd=folder)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prog = pygraphx.load(folder / "h.pgx")
    ins = prog.get_main_module().instructions
    assert any(i.op.name == "quant_convolution" for i in ins)
    assert any(i.shape.type() == "half_type" for i in ins)
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    assert 0.0 < rel_rms(np.asarray(prog.run({"input": x})[0]), ort_float(folder, x)) < 0.05
    proc = cli("verify", "model.onnx", "--int8", "--fp16", "--calibration", "cal.npz", "--json",
               cwd=folder)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["precision"] == "int8+fp16"
    for flags in (("--fp16", "--bf16"), ("--int8", "--fp8")):
        proc = cli("compile", "model.onnx", *flags, cwd=folder)
        assert proc.returncode == 2 and "not allowed with argument" in proc.stderr, flags
