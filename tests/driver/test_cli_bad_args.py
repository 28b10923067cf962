"""The driver refuses bad arguments with a clear message, through the real entry point in a fresh
process (issue 16, case 5): `--seed` out of range, `--input-dim` too large to allocate (named with
its byte count, before any allocation), and a model path that is no regular file. Each process
runs under an address-space limit, so a regression fails instead of exhausting the machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import pygraphx
from pygraphx.driver.inputs import check_input_sizes

REPO = Path(__file__).resolve().parents[2]
LIMIT = 4 << 30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def driver(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m pygraphx argv...` under a 4 GiB address-space limit."""
    return subprocess.run(
        [sys.executable, "-m", "pygraphx", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
        check=False,
        preexec_fn=_limit_memory,
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bad_args")
    for name, lens in (("rank2.onnx", [2, 3]), ("rank3.onnx", [2, 3, 4])):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, lens)
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        onnx.save(model, folder / name)
    return folder


def _refused(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    for text in expected:
        assert text in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("seed", "message"),
    [
        ("-1", "must be in [0, 2**63 - 1], got -1"),
        (str(2**64), f"got {2**64}"),
        ("many", "expected an integer, got 'many'"),
    ],
)
def test_seed_out_of_range(models: Path, seed: str, message: str) -> None:
    proc = driver("run", "rank2.onnx", "--seed", seed, cwd=models)
    _refused(proc, "argument --seed", message)
    assert proc.returncode == 2  # argparse's usage error


def test_generate_seed_out_of_range(models: Path) -> None:
    argv = ("generate", "--model", "llama_tiny", "--prompt-ids", "1", "--seed", "-1")
    proc = driver(*argv, cwd=models)
    _refused(proc, "argument --seed", "must be in [0, 2**63 - 1], got -1")


def test_largest_seed_runs(models: Path) -> None:
    proc = driver("run", "rank2.onnx", "--seed", str(2**63 - 1), cwd=models)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("target", ["--ref", "--cpu"])
def test_input_dim_too_large_to_allocate(models: Path, target: str) -> None:
    if target == "--cpu":
        pytest.importorskip("torch")
    argv = ("run", "rank3.onnx", target, "--input-dim", "@x", "100000", "100000", "100000")
    proc = driver(*argv, cwd=models)
    if target == "--ref":  # ref compiles without allocating; the inputs are refused unmade
        _refused(proc, "input 'x'", "[100000, 100000, 100000]", "4,000,000,000,000,000 bytes")
    else:  # cpu plans an arena for the intermediates first, and says it cannot have it
        _refused(proc, "4,000,000,000,000,000-byte", "arena", "main:@")


@pytest.mark.parametrize(
    "argv",
    [
        ("read", "--onnx", "{dev}"),
        ("read", "{dev}"),
        ("run", "--migraphx", "{dev}"),
        ("read", "{fifo}"),
    ],
    ids=["onnx", "file", "migraphx", "fifo"],
)
def test_model_that_is_no_regular_file(models: Path, argv: tuple[str, ...]) -> None:
    fifo = models / "pipe"
    if not fifo.exists():
        os.mkfifo(fifo)
    args = [a.format(dev="/dev/zero", fifo=fifo) for a in argv]
    proc = driver(*args, cwd=models)
    _refused(proc, "not a regular file")


def test_check_input_sizes_names_input_and_bytes() -> None:
    shapes = {"a": pygraphx.Shape("half_type", [10, 10]), "b": pygraphx.Shape("int64_type", [8])}
    check_input_sizes(shapes, limit=264)  # 200 + 64 bytes: fits exactly
    with pytest.raises(ValueError, match="the inputs need 264 bytes together"):
        check_input_sizes(shapes, limit=263)
    with pytest.raises(ValueError, match=r"input 'a' \(half_type \[10, 10\]\) needs 200 bytes"):
        check_input_sizes(shapes, limit=199)


@pytest.mark.parametrize("type_name", ["float_type", "half_type", "double_type"])
def test_random_inputs_are_made_in_their_own_type(type_name: str) -> None:
    """No float64 copy of a float32 input: peak memory stays near the input's own bytes."""
    shape = pygraphx.Shape(type_name, [500, 1000])
    tracemalloc.start()
    try:
        arr = np.asarray(pygraphx.generate_argument(shape, seed=3))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert arr.dtype == shape.dtype() and arr.shape == (500, 1000)
    assert arr.min() >= -1 and arr.max() <= 1 and abs(float(arr.mean())) < 0.01
    own = arr.nbytes if type_name != "half_type" else 2 * arr.nbytes  # drawn in float32
    assert peak < own * 1.6, (peak, own)


def test_absurd_dynamic_dimension_is_refused_cleanly(tmp_path: Path) -> None:
    """A dynamic dimension beyond any address space (a driver-fuzzing finding: torch failed to
    unpack the arena's byte count) is a clear arena error, not an internal error."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "dyn.onnx")  # fmt: skip
    proc = driver("run", "--cpu", "dyn.onnx", "--dyn-input-dim", "@x", "9" * 40, "{1,8}",
                  cwd=tmp_path)  # fmt: skip
    _refused(proc, "cannot allocate", "arena")
