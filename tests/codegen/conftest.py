"""Fixtures of the code generator tests: Triton kernels run in its interpreter on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


def _has_gpu() -> bool:
    torch = pytest.importorskip("torch")
    return bool(torch.cuda.is_available())


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Triton's interpreter on, and a fresh kernel cache; returns the cache directory."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    if _has_gpu():
        # switching the interpreter on inside a process that compiles real kernels leaves
        # Triton's language patched (later kernels fail to compile); on a GPU machine the same
        # kernels are compiled and checked by tests/targets/gpu
        pytest.skip("the interpreter tests run where there is no GPU (CI)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("PGX_CACHE_DIR", str(tmp_path / "kernels"))
    return tmp_path / "kernels"
