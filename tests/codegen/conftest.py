"""Fixtures of the code generator tests: Triton kernels run in its interpreter on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Triton's interpreter on, and a fresh kernel cache; returns the cache directory."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("PGX_CACHE_DIR", str(tmp_path / "kernels"))
    return tmp_path / "kernels"
