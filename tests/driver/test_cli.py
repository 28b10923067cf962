"""The `pygraphx-driver` command line as a MIGraphX user types it, run as a real process.

Every test runs `python -m pygraphx ...` (the `pygraphx-driver` entry point) in a subprocess and
checks the exit status and the message. The model is a small CNN written to `ResNet50.onnx` in
a temporary folder, so the `migraphx-driver` command lines of MIGraphX's own documentation run
as written, only faster; values are compared with numpy where a command prints them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import pygraphx

REPO = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
FC = RNG.standard_normal((5, 4)).astype(np.float32)


def cnn_model(batch: int | str = "N") -> onnx.ModelProto:
    """input: float[N, 3, 16, 16] -> conv 3x3 (4) -> relu -> global average pool -> gemm (5)."""
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc"], ["output"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, 5])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(FC, "fc")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cli(
    *argv: str, cwd: Path | str = REPO, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`pygraphx-driver argv...` in a fresh process (stdout and stderr are pipes)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pygraphx", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
        check=False,
        input=stdin,
    )


def has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ResNet50.onnx (the small CNN) and ResNet50.mxr (it, compiled for ref)."""
    path = tmp_path_factory.mktemp("seeds")
    onnx.save(cnn_model(), path / "ResNet50.onnx")
    prog = pygraphx.parse_onnx(path / "ResNet50.onnx")
    prog.compile(pygraphx.get_target("ref"))
    pygraphx.save(prog, path / "ResNet50.mxr")
    return path


# --- 0. MIGraphX's documented command lines, as written -----------------------------------------
_PERF = "perf --enable-offload-copy --batch 2 --input-dim @input 2 3 16 16 -n 3 --fp16"
SEED_LINES = [
    # (command line after `migraphx-driver`, a fragment of stdout)
    (
        "compile --enable-offload-copy --binary --output ./ResNet50.mxr --onnx ./ResNet50.onnx",
        "Wrote: ResNet50.mxr (saved program compiled for ref, binary",
    ),
    ("params --onnx ./ResNet50.onnx", "input: float_type, {1, 3, 16, 16}, {768, 256, 16, 1}"),
    ("params --migraphx ./ResNet50.mxr", "output: float_type, {1, 5}, {5, 1}"),
    ("version", "Program file format version: 1"),
    ("version --migraphx ./ResNet50.mxr", "format version: 1 (this pygraphx"),
    ("onnx -l", "Conv"),
    ("read --onnx ResNet50.onnx", "convolution[padding={1, 1, 1, 1}"),
    ("read --migraphx ./ResNet50.mxr", 'module: "main"'),
    ("perf --enable-offload-copy -h", "--enable-offload-copy"),
    (f"{_PERF} --cpu --onnx ./ResNet50.onnx", "Batch size: 2 (first dimension of input"),
    (f"{_PERF} --gpu --onnx ./ResNet50.onnx", "Batch size: 2 (first dimension of input"),
    ("perf --enable-offload-copy -n 3 --onnx ./ResNet50.onnx", "Summary:"),
    ("--version", "pygraphx version: "),
]


@pytest.mark.parametrize(("line", "expected"), SEED_LINES, ids=[s[0] for s in SEED_LINES])
def test_migraphx_driver_command_lines_run_as_written(
    folder: Path, line: str, expected: str
) -> None:
    if "--gpu" in line.split() and not has_gpu():
        pytest.skip("no GPU: torch sees no CUDA/ROCm device")
    proc = cli(*line.split(), cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert expected in proc.stdout, proc.stdout


def test_version_of_a_saved_program(folder: Path) -> None:
    proc = cli("version", "--migraphx", "ResNet50.mxr", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "File: ResNet50.mxr",
        f"Program file format version: 1 (this pygraphx {pygraphx.__version__} reads 1: "
        "compatible)",
        f"Written by pygraphx version: {pygraphx.__version__}",
        "Compiled for target: ref",
    ]
    bad = folder / "text.mxr"
    bad.write_text('module: "main"\n')
    proc = cli("version", "--migraphx", str(bad))
    assert proc.returncode == 1
    assert "not a saved pygraphx program (bad magic number)" in proc.stderr


# --- 2, 3. a positional model file, -o, formats from the extension -------------------------------
def test_positional_file_compile_o_then_run(tmp_path: Path) -> None:
    onnx.save(cnn_model(1), tmp_path / "m.onnx")
    proc = cli("compile", "m.onnx", "-o", "m.pgx", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Wrote: m.pgx (saved program compiled for ref, binary" in proc.stdout
    run = cli("run", "m.pgx", "--fill1", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "Reading: m.pgx (saved program)" in run.stdout
    # all-ones input: conv sums 27 weights per filter, relu, mean over 16x16 (edges pad 0)
    x = np.ones((1, 3, 16, 16), np.float32)
    expected = np.asarray(reference_cnn(x))
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("  min: "))
    assert float(line.split(",")[0].split()[-1]) == pytest.approx(expected.min(), rel=1e-4)


def reference_cnn(x: np.ndarray) -> np.ndarray:
    """The CNN in numpy (the oracle for the driver's printed values)."""
    n, _, h, w = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros((n, 4, h, w), np.float64)
    for i in range(3):
        for j in range(3):
            patch = padded[:, :, i : i + h, j : j + w]
            conv += np.einsum("nchw,oc->nohw", patch, W[:, :, i, j])
    pooled = np.maximum(conv, 0).mean(axis=(2, 3))
    return pooled @ FC.T


def test_perf_positional_onnx(tmp_path: Path) -> None:
    onnx.save(cnn_model(), tmp_path / "model.onnx")
    proc = cli("perf", "model.onnx", "-n", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Reading: model.onnx" in proc.stdout and "Summary:" in proc.stdout


@pytest.mark.parametrize(
    ("name", "flags", "kind"),
    [
        ("out.pgx", [], "binary"),
        ("out.mxr", [], "binary"),
        ("out.txt", [], "text"),
        ("out.json", [], "json"),
        ("out.prog", [], "text"),
        ("out.prog", ["--binary"], "binary"),
    ],
)
def test_compile_output_format_from_extension(
    tmp_path: Path, name: str, flags: list[str], kind: str
) -> None:
    onnx.save(cnn_model(), tmp_path / "m.onnx")
    proc = cli("compile", "m.onnx", "--output", name, *flags, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    written = tmp_path / name
    if kind == "binary":
        assert f"Wrote: {name} (saved program compiled for ref, binary" in proc.stdout
        assert pygraphx.load(written).is_compiled()
        return
    assert f"Wrote: {name} (compiled program for ref, {kind}:" in proc.stdout
    text = written.read_text()
    if kind == "json":
        doc = json.loads(text)
        assert doc["target"] == "ref" and any("convolution" in ln for ln in doc["modules"]["main"])
    else:
        assert text.startswith('module: "main"')


def test_loading_text_as_a_program_names_binary(tmp_path: Path) -> None:
    onnx.save(cnn_model(), tmp_path / "m.onnx")
    assert cli("compile", "m.onnx", "-o", "m.txt", cwd=tmp_path).returncode == 0
    proc = cli("run", "--migraphx", "m.txt", cwd=tmp_path)
    assert proc.returncode == 1
    assert "bad magic number" in proc.stderr
    assert "--binary" in proc.stderr and ".pgx/.mxr" in proc.stderr
    clash = cli("compile", "m.onnx", "-o", "m.txt", "--binary", cwd=tmp_path)
    assert clash.returncode == 1 and "name it .pgx or .mxr" in clash.stderr


@pytest.mark.parametrize("command", ["read", "params", "compile", "run", "time", "perf", "verify"])
def test_every_command_help_shows_examples(command: str) -> None:
    proc = cli(command, "--help")
    assert proc.returncode == 0
    examples = proc.stdout.split("examples:\n", 1)[1].splitlines()
    assert examples and all(ln.startswith("  pygraphx-driver ") for ln in examples if ln)


def test_model_given_twice_or_not_at_all(tmp_path: Path) -> None:
    onnx.save(cnn_model(), tmp_path / "m.onnx")
    twice = cli("params", "m.onnx", "--onnx", "m.onnx", cwd=tmp_path)
    assert twice.returncode == 2 and "the model is given twice" in twice.stderr
    none = cli("params")
    assert none.returncode == 2 and "give the model: a FILE" in none.stderr
