"""Shared pytest configuration and fixtures for the pygraphx test suite.

Sections are owned by different contributors; add new fixtures in a section of your own.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

# ============================================================================================
# Triton's interpreter on machines without a GPU
#   users: tests/codegen/, the gpu target's Triton path on the CPU
# ============================================================================================
# Triton decides at its first import whether its library functions (`tl.zeros`, `tl.max`, ...)
# are interpreted; torch imports triton as a side effect of some exports. So on a machine with no
# GPU the interpreter is switched on here, before any test runs, instead of per test.
_GPU_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/kfd")
if not any(os.path.exists(f) for f in _GPU_DEVICE_FILES):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# ============================================================================================
# The cpu target's convolution choice cache
#   owner: pygraphx/targets/torch_lowering/choice_cache.py    users: every test that compiles
# ============================================================================================
# Unset, PGX_CONV_CHOICE_CACHE means a per-user file under $XDG_CACHE_HOME/pygraphx/: tests
# never read or write it (a choice another run measured would hide what a test checks); those
# that test the file set the variable (or XDG_CACHE_HOME) to a temporary path themselves.
os.environ["PGX_CONV_CHOICE_CACHE"] = "off"

# ============================================================================================
# Exported real-architecture models (ResNet-50, MobileNetV2, BERT-base, GPT-2)
#   helpers: tests/exported_models.py    users: tests/models/test_exported_vs_ort.py
# ============================================================================================

#: Overrides where exported models are cached (default: pytest's cache dir, kept across runs).
EXPORT_CACHE_ENV = "PYGRAPHX_EXPORT_CACHE"

#: Models that need ``transformers`` on top of ``torch``.
_TRANSFORMERS_MODELS = frozenset({"bert_base", "gpt2"})

ExportedModel = tuple[Path, dict[str, np.ndarray]]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: long-running test (real-model exports, whole-network runs); "
        "deselect with -m 'not slow'",
    )


def _load_exported_models() -> ModuleType:
    """Import tests/exported_models.py by path, independent of pytest's import mode."""
    module_name = "exported_models"
    module = sys.modules.get(module_name)
    if module is not None:
        return module
    path = Path(__file__).with_name("exported_models.py")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _export_cache_dir(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    override = os.environ.get(EXPORT_CACHE_ENV)
    if override:
        return Path(override)
    cache = getattr(config, "cache", None)  # None when run with -p no:cacheprovider
    if cache is not None:
        return Path(cache.mkdir("exported"))
    return tmp_path_factory.mktemp("exported")


@pytest.fixture(scope="session")
def exported_model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], ExportedModel]:
    """Factory ``get(name) -> (onnx_path, inputs)`` for the real-architecture exports.

    Each model is exported at most once per session (and reused from the on-disk cache across
    sessions while its cache key is unchanged).  Tests are skipped when torch, or transformers
    for the HuggingFace models, is not installed.  ``inputs`` is a fresh copy on every call.
    """
    cache_dir = _export_cache_dir(request.config, tmp_path_factory)
    memo: dict[str, ExportedModel] = {}

    def get(name: str) -> ExportedModel:
        if name not in memo:
            pytest.importorskip("torch")
            if name in _TRANSFORMERS_MODELS:
                pytest.importorskip("transformers")
            memo[name] = _load_exported_models().export_cached(name, cache_dir)
        path, inputs = memo[name]
        return path, {key: value.copy() for key, value in inputs.items()}

    return get


# ============================================================================================
# End of exported-model section
# ============================================================================================


# --- pass counts of the official ONNX suites in the summary (CI shows them) -------------------
_SUITES = {
    "tests/onnx/test_backend_node.py": "ONNX backend node suite on ref",
    "tests/targets/test_cpu_node_suite.py": "ONNX backend node suite on cpu",
    "tests/onnx/test_backend_models.py::OnnxBackendSimpleModelTest": "ONNX simple model suite",
    "tests/onnx/test_backend_models.py::OnnxBackendPyTorchConvertedModelTest": (
        "ONNX pytorch-converted suite"
    ),
    "tests/onnx/test_backend_models.py::OnnxBackendPyTorchOperatorModelTest": (
        "ONNX pytorch-operator suite"
    ),
    "tests/onnx/test_backend_models.py::OnnxBackendRealModelTest": "ONNX real (light zoo) suite",
}


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    counts = {label: [0, 0] for label in _SUITES.values()}
    for outcome, index in (("passed", 0), ("failed", 1)):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            for prefix, label in _SUITES.items():
                if nodeid.startswith(prefix):
                    counts[label][index] += 1
    shown = {label: c for label, c in counts.items() if sum(c)}
    if shown:
        terminalreporter.section("ONNX suites")
        for label, (passed, failed) in shown.items():
            terminalreporter.write_line(f"{label}: {passed} passed, {failed} failed")
