"""The supported-operator list: API, driver and the generated docs table agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pygraphx
from pygraphx.driver.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_docs_table_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_op_table.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_get_onnx_operators_and_driver_list(capsys) -> None:
    ops = pygraphx.get_onnx_operators()
    for name in ("Conv", "LSTM", "If", "Loop", "Attention", "QuantizeLinear", "NonZero"):
        assert name in ops
    assert "com.microsoft::SkipLayerNormalization" in ops
    assert main(["onnx", "--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert set(ops) <= set(listed)
