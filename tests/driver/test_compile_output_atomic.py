"""`compile --binary --output` writes atomically like `pygraphx.save` (issue 16, case 2): a full
disk during the write is a clear error (exit status 1, no internal error) and the program saved
there before still loads and computes what it did."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import pygraphx
from pygraphx.driver.main import main
from pygraphx.ir import atomic_write
from tests.helpers import make_model
from tests.ir.test_atomic_save import _FullDisk, _program, _value_of


def test_full_disk_during_compile_output_keeps_old_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.pgx"
    pygraphx.save(_program(16, 1.0), out)  # the good program already there: x + 1
    big = tmp_path / "big.onnx"
    onnx.save(_program_model(1 << 20), big)
    real_fdopen = os.fdopen
    monkeypatch.setattr(
        atomic_write.os, "fdopen", lambda fd, mode: _FullDisk(real_fdopen(fd, mode), 1 << 16)
    )
    status = main(["compile", str(big), "--binary", "--output", str(out)])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert status == 1, err
    assert "internal error" not in err and "m.pgx: write failed" in err, err
    assert _value_of(out) == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "m.pgx"]


def _program_model(n: int) -> onnx.ModelProto:
    """The ONNX form of `_program(n, 2.0)`: x + w with a weight of n floats."""
    x = np.zeros(n, np.float32)
    w = np.full(n, 2.0, np.float32)
    return make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": x}, ["y"], {"w": w})
