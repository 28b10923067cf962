"""rn12: a narrow residual expansion (a 1x1 convolution of 32-128 input channels and at least
4x as many outputs, adding its block's residual) runs on oneDNN's `jit_1x1:avx2` on an AMD
processor (`conv_choice.residual_1x1_impl`, `PGX_CONV_RESIDUAL_1X1`). Outputs against ONNX
Runtime with the rule on, off and forced; the choice on this processor.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import choice_cache, conv_choice, onednn_conv  # noqa: E402
from tests.helpers import run_ort  # noqa: E402
from tests.targets.cpu_compare import f32, make_model  # noqa: E402

pytestmark = pytest.mark.skipif(
    not onednn_conv.available(), reason="oneDNN's C API library (onednn-cpu-gomp) not installed"
)
IMPL = conv_choice.RESIDUAL_1X1_IMPL


def _bottleneck(c: int = 64, batch: int = 2) -> tuple[object, dict[str, np.ndarray]]:
    """ResNet's first bottleneck: y = relu(conv1x1(relu(conv1x1(x))) + downsample(x)), the
    expansion c -> 4c adding the downsample's result (a convolution: it may share its slot)."""
    k = 4 * c
    inits = {
        "wa": f32(c, c, 1, 1) * 0.2, "ba": f32(c),
        "wb": f32(k, c, 1, 1) * 0.2, "bb": f32(k),
        "wd": f32(k, c, 1, 1) * 0.2, "bd": f32(k),
    }  # fmt: skip
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "wd", "bd"], ["d"]),
        node("Conv", ["x", "wa", "ba"], ["ca"]),
        node("Relu", ["ca"], ["a"]),
        node("Conv", ["a", "wb", "bb"], ["cb"]),
        node("Add", ["cb", "d"], ["s"]),
        node("Relu", ["s"], ["y"]),
    ]
    feeds = {"x": f32(batch, c, 12, 12)}
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.fixture
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (conv_choice.KERNEL_ENV, conv_choice.BUDGET_ENV, conv_choice.RESIDUAL_1X1_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(conv_choice.CACHE_ENV, "off")
    conv_choice.clear_cache()


def _run(model: object, feeds: dict) -> tuple[np.ndarray, dict]:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    chosen = prog._executable.lowered.ctx.cache["conv_choice"].chosen
    return np.asarray(prog.run(feeds)[0]), dict(chosen)


def _offered(model: object) -> bool:
    """Whether oneDNN offers `IMPL` here (it needs AVX2)."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@pytest.mark.usefixtures("_fresh")
@pytest.mark.parametrize("setting", ["auto", "off", IMPL])
def test_outputs_match_ort(setting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = _bottleneck()
    if setting != "auto":
        monkeypatch.setenv(conv_choice.RESIDUAL_1X1_ENV, setting)
    if setting == IMPL and not _offered(model):
        pytest.skip(f"{IMPL} needs AVX2")
    got, chosen = _run(model, feeds)
    np.testing.assert_allclose(got, run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)
    taken = chosen.get(f"dnnl/{IMPL}", 0)
    amd = choice_cache.cpu_vendor() == "AuthenticAMD"
    want = {"auto": int(amd and _offered(model)), "off": 0, IMPL: 1}[setting]
    assert taken == want, chosen


@pytest.mark.usefixtures("_fresh")
def test_only_narrow_expansions_take_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(conv_choice.RESIDUAL_1X1_ENV, IMPL)
    if not _offered(None):
        pytest.skip(f"{IMPL} needs AVX2")
    for c in (16, 256):  # below and above the channel range
        model, feeds = _bottleneck(c)
        got, chosen = _run(model, feeds)
        assert f"dnnl/{IMPL}" not in chosen, (c, chosen)
        np.testing.assert_allclose(got, run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("_fresh")
def test_an_implementation_not_offered_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(conv_choice.RESIDUAL_1X1_ENV, "no_such_kernel:avx9")
    model, _ = _bottleneck()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    with pytest.raises(conv_choice.ConvChoiceError, match="PGX_CONV_RESIDUAL_1X1"):
        prog.compile(CpuTarget(threads=1))
