"""The layering contracts of pyproject.toml ([tool.importlinter]) hold: `lint-imports` passes.

A lower layer (ir < ops < passes < runtime < codegen < targets < onnx/models/quantize <
serve/generate < driver) never imports a higher one, targets never import each other, only the
API imports the top-level package, and no package's modules import each other in a cycle.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports() -> str:
    exe = Path(sys.executable).with_name("lint-imports")
    if exe.exists():
        return str(exe)
    found = shutil.which("lint-imports")
    if found is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    return found


def test_import_contracts_are_kept() -> None:
    proc = subprocess.run(
        [_lint_imports(), "--no-cache"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this tree's pygraphx
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "KEPT" in report and "BROKEN" not in report, report
