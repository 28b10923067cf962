"""Whole-network check: pygraphx's reference target against ONNX Runtime on real architectures.

The models (ResNet-50, MobileNetV2, BERT-base, GPT-2 small) are exported from PyTorch with
random weights by ``tests/exported_models.py`` through the ``exported_model`` fixture.  ONNX
Runtime on the CPU execution provider is the oracle.  Its outputs are first checked to be
non-degenerate, so that a comparison against near-constant outputs cannot pass vacuously.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.slow

MODEL_NAMES = ("resnet50", "mobilenetv2", "bert_base", "gpt2")
RTOL = 1e-4
ATOL = 1e-5
#: Per-model absolute tolerance where fp32 summation-order noise alone exceeds ``ATOL``.
#: ResNet-50 logits (|x| <= 1.8): ONNX Runtime fp32 and torch fp32 both differ from a float64
#: evaluation by up to 3.5e-5, and would need atol >= 2.8e-5 at rtol=1e-4 to pass against it, so
#: two correct fp32 implementations cannot be expected to agree to 1e-5. pygraphx's ref differs
#: from ORT by at most 2.8e-5 there (measured); every other model meets ATOL.
ATOL_OVERRIDES: dict[str, float] = {"resnet50": 4e-5}
MIN_STD = 1e-3

ExportedModel = Callable[[str], tuple[Path, dict[str, np.ndarray]]]


def _pygraphx() -> ModuleType:
    """Return the pygraphx module, skipping while its Python API is not in place yet."""
    pygraphx = pytest.importorskip("pygraphx")
    missing = [attr for attr in ("parse_onnx", "get_target") if not hasattr(pygraphx, attr)]
    if missing:
        pytest.skip(f"pygraphx does not provide {', '.join(missing)} yet")
    return pygraphx


def _run_ort(onnx_path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the model with ONNX Runtime (CPU); returns outputs keyed by name, in graph order."""
    options = ort.SessionOptions()
    # Keep the oracle literal: no fusions that re-associate floating-point arithmetic.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    names = [out.name for out in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs), strict=True))


def _assert_non_degenerate(name: str, outputs: dict[str, np.ndarray]) -> None:
    for out_name, value in outputs.items():
        assert np.all(np.isfinite(value)), f"{name}:{out_name} has non-finite ORT output"
        std = float(np.std(value))
        assert std > MIN_STD, (
            f"{name}:{out_name} ORT output is degenerate (std={std:.3g}); "
            "the comparison would prove nothing"
        )


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_ort_oracle_is_non_degenerate(name: str, exported_model: ExportedModel) -> None:
    """The fixture's exports load in ONNX Runtime and give well-spread outputs."""
    onnx_path, inputs = exported_model(name)
    _assert_non_degenerate(name, _run_ort(onnx_path, inputs))


@pytest.mark.parametrize("optimize", [False, True], ids=["parsed", "optimized"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_ref_target_matches_ort(name: str, optimize: bool, exported_model: ExportedModel) -> None:
    """Every output of the compiled reference program (as parsed, and after the optimisation
    passes) matches ONNX Runtime."""
    pygraphx = _pygraphx()
    onnx_path, inputs = exported_model(name)

    expected = _run_ort(onnx_path, inputs)
    _assert_non_degenerate(name, expected)

    prog = pygraphx.parse_onnx(str(onnx_path))
    if optimize:
        pygraphx.optimize(prog)
    prog.compile(pygraphx.get_target("ref"))
    results = prog.run({key: value.copy() for key, value in inputs.items()})

    assert len(results) == len(expected), (
        f"{name}: pygraphx returned {len(results)} outputs, ONNX Runtime {len(expected)}"
    )
    for result, (out_name, ort_value) in zip(results, expected.items(), strict=True):
        ours = np.array(result)
        assert ours.shape == ort_value.shape, f"{name}:{out_name} shape mismatch"
        np.testing.assert_allclose(
            ours,
            ort_value,
            rtol=RTOL,
            atol=ATOL_OVERRIDES.get(name, ATOL),
            err_msg=f"{name}:{out_name}",
        )
