"""Seed 001's Python ResNet-50 example runs with `import pygraphx as migraphx` on `ref`."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "resnet50_classify.py"


@pytest.mark.slow
def test_resnet50_example_matches_onnxruntime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pygraphx.models import get_model

    path = tmp_path / "ResNet50.onnx"
    path.write_bytes(get_model("resnet50").SerializeToString())
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), str(path), "--target", "ref"])
    namespace = runpy.run_path(str(EXAMPLE), run_name="example")
    result = namespace["main"]([str(path), "--target", "ref"])
    out = capsys.readouterr().out
    assert "inputs:\ninput:float_type, {1, 3, 224, 224}, {150528, 50176, 224, 1}" in out
    assert "outputs:\noutput:float_type, {1, 1000}, {1000, 1}" in out
    assert "top-5 classes:" in out
    image = namespace["ReadImage"]([1, 3, 224, 224])
    (expected,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"input": image}
    )
    assert result.shape == (1, 1000) and float(np.std(expected)) > 1e-2
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-5)
