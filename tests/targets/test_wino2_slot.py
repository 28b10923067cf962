"""The Winograd kernels write their result's arena slot themselves (`winograd.build`'s `out`,
`conv_kernels.WRITES_OUT`), as `dnnl` does: no new tensor per call copied into the slot.

Oracles: ONNX Runtime for the compiled block (two runs in a row, the second reading the slots
the first left, and a profiled run), float64 `F.conv2d` for `build` with a given buffer.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from pygraphx.targets.torch_lowering import conv_choice, winograd  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import WRITES_OUT, ConvPlan  # noqa: E402
from tests.helpers import run_ort  # noqa: E402
from tests.targets.test_winograd import _compiled, _resnet_block  # noqa: E402


@pytest.fixture
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (conv_choice.KERNEL_ENV, conv_choice.BUDGET_ENV, conv_choice.WINOGRAD_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(conv_choice.CACHE_ENV, "off")
    conv_choice.clear_cache()


@pytest.mark.usefixtures("_fresh")
@pytest.mark.parametrize("kernel", list(winograd.KERNEL_TILES))
def test_winograd_layers_write_their_slots(kernel: str, caplog: pytest.LogCaptureFixture) -> None:
    assert kernel in WRITES_OUT
    model, feeds = _resnet_block()
    prog = _compiled(model, caplog, conv_kernel=kernel)
    ctx = prog._executable.lowered.ctx
    assert ctx.cache["conv_choice"].chosen[kernel] == 3
    # the three layers: the first and last write their slots; the residual one may write
    # over its add operand (then it allocates, as before)
    assert ctx.cache.get("conv_into_slot", 0) >= 2
    want = run_ort(model, feeds)[0]
    for _ in range(2):
        np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    profiled = prog.run(feeds, observer=lambda ins, v, s: None)
    np.testing.assert_allclose(profiled[0], want, rtol=1e-4, atol=1e-4)


def test_build_writes_the_given_buffer() -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(24, 20, 3, 3, generator=gen) / 8
    bias = torch.randn(24, generator=gen)
    plan = ConvPlan(w, w, [2, 20, 9, 10], [1, 1], [1, 1], [1, 1], 1, None, bias=bias, unary="relu")
    x = torch.randn(2, 20, 9, 10, generator=gen).contiguous(memory_format=torch.channels_last)
    out = torch.full((2, 24, 9, 10), 7.0).contiguous(memory_format=torch.channels_last)
    run = winograd.build(plan, lambda: x, None, 4, out)
    assert run() is out
    want = F.relu(F.conv2d(x.double(), w.double(), bias.double(), padding=1))
    err = float((out.double() - want).abs().max() / want.abs().max())
    assert err < 3e-5, err


def test_build_rejects_a_wrong_buffer() -> None:
    w = torch.randn(8, 8, 3, 3)
    plan = ConvPlan(w, w, [1, 8, 6, 6], [1, 1], [1, 1], [1, 1], 1, None)
    plain = torch.empty(1, 8, 6, 6)  # NCHW-contiguous, not channels-last
    with pytest.raises(ValueError, match="winograd: the output buffer"):
        winograd.build(plan, lambda: plain, None, 4, plain)
