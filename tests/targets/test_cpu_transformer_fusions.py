"""The cpu target's transformer fusions: attention blocks run as one
`scaled_dot_product_attention` step, checked against numpy on small blocks and against ONNX
Runtime on exported BERT-base and GPT-2 (real architectures, random weights)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from tests.targets.gpu.test_gpu_target import attention_model  # noqa: E402

ExportedModel = Callable[[str], tuple[Path, dict[str, np.ndarray]]]


def compile_cpu(model, **settings) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(**settings))
    return prog


@pytest.mark.parametrize("kind", ["mask", "causal"])
def test_attention_runs_fused_and_exact(kind: str) -> None:
    model, feeds, want = attention_model(kind)
    prog = compile_cpu(model)
    assert prog._executable.attention_blocks == 1
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), want, rtol=1e-5, atol=1e-5)
    off = compile_cpu(model, attention=False)
    assert off._executable.attention_blocks == 0
    np.testing.assert_allclose(np.array(off.run(feeds)[0]), want, rtol=1e-5, atol=1e-5)


def test_other_prologues_are_not_attention() -> None:
    model, feeds, want = attention_model("exp")
    prog = compile_cpu(model)
    assert prog._executable.attention_blocks == 0
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), want, rtol=1e-4, atol=1e-5)


def test_fused_attention_profiles_every_instruction() -> None:
    """A profiled run (observer) still reports the three instructions of the block."""
    model, feeds, want = attention_model("mask")
    prog = compile_cpu(model)
    seen: list[str] = []
    got = prog.run(feeds, observer=lambda ins, value, seconds: seen.append(ins.op.name))
    np.testing.assert_allclose(np.array(got[0]), want, rtol=1e-5, atol=1e-5)
    assert seen.count("dot") == 2 and "fused_reduce" in seen


def _ort(path: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_base", "gpt2"])
def test_exported_transformers_match_ort(name: str, exported_model: ExportedModel) -> None:
    """Every attention block of the export is fused, and the outputs match ONNX Runtime."""
    path, inputs = exported_model(name)
    want = _ort(path, inputs)
    prog = pygraphx.parse_onnx(str(path))
    prog.compile(CpuTarget(threads=2))
    assert prog._executable.attention_blocks == 12
    got = prog.run({k: v.copy() for k, v in inputs.items()})
    for ours, theirs in zip(got, want, strict=True):
        assert np.std(theirs) > 1e-3
        np.testing.assert_allclose(np.array(ours), theirs, rtol=1e-4, atol=2e-5)
