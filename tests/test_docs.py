"""The documentation: the mkdocs site builds with warnings as errors, and the public API has
explicit signatures and docstrings with an example (what `help()` and the API reference show)."""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pygraphx

REPO = Path(__file__).resolve().parents[1]

#: public functions whose docstrings the API reference shows: each needs an example
DOCUMENTED = [
    pygraphx.parse_onnx,
    pygraphx.parse_onnx_buffer,
    pygraphx.get_target,
    pygraphx.save,
    pygraphx.load,
    pygraphx.quantize_fp16,
    pygraphx.quantize_bf16,
    pygraphx.quantize_int8,
    pygraphx.quantize.int8_report,
    pygraphx.Program.compile,
    pygraphx.Program.run,
]


def test_mkdocs_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    parsing = (tmp_path / "site" / "api" / "parsing" / "index.html").read_text()
    for option in ("map_input_dims", "map_dyn_input_dims", "default_dyn_dim_value"):
        assert option in parsing
    shutil.rmtree(tmp_path / "site")


@pytest.mark.parametrize("fn", DOCUMENTED, ids=lambda f: f.__qualname__)
def test_public_functions_have_docstrings_with_an_example(fn: object) -> None:
    doc = inspect.getdoc(fn) or ""
    assert "Example:" in doc and ">>> " in doc, fn


def test_parse_onnx_signature_names_every_option() -> None:
    for fn in (pygraphx.parse_onnx, pygraphx.parse_onnx_buffer):
        params = inspect.signature(fn).parameters
        for option in (
            "default_dim_value",
            "map_input_dims",
            "map_dyn_input_dims",
            "default_dyn_dim_value",
            "skip_unknown_operators",
        ):
            assert params[option].kind is inspect.Parameter.KEYWORD_ONLY
            assert option in (pygraphx.parse_onnx.__doc__ or "")  # documented there


def test_readme_is_written_for_a_new_user() -> None:
    readme = (REPO / "README.md").read_text()
    for shorthand in ("seed 00", "seeds'", "seed 001", "seed 003"):
        assert shorthand not in readme.lower()
    assert "--index-url https://download.pytorch.org/whl/cpu" in readme
    assert "pip install pygraphx" in readme and "pygraphx[torch]" in readme
    assert 'python -m pytest -n 2 -q -m "not slow"' in readme
