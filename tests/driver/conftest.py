"""Fixtures of the driver tests."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.driver.driver_models import small_model


@pytest.fixture
def model_path(tmp_path: Path) -> str:
    path = tmp_path / "small.onnx"
    onnx.save(small_model(), path)
    return str(path)
