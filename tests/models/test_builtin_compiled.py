"""The built-in models through the whole pipeline: optimise, compile on ref, save, load, run.

Outputs must match ONNX Runtime after optimisation, and a saved then loaded program must give
bit-identical outputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import pygraphx
from pygraphx.models import get_model, model_inputs

SEQ = 32


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2", "bert_base", "gpt2"])
def test_optimised_save_load_run(name: str, tmp_path: Path) -> None:
    model = get_model(name, seq_len=SEQ)
    feeds = model_inputs(name, model)
    expected = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)

    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.optimize(prog)
    text = str(prog)
    assert "batch_norm_inference" not in text
    prog.compile(pygraphx.get_target("ref"))
    ours = [np.array(r) for r in prog.run(feeds)]
    for a, b in zip(ours, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

    path = tmp_path / f"{name}.pgx"
    pygraphx.save(prog, path)
    loaded = pygraphx.load(path)
    assert loaded.is_compiled() and str(loaded) == text
    again = [np.array(r) for r in loaded.run(feeds)]
    for a, b in zip(again, ours, strict=True):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
