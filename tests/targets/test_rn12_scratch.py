"""The Winograd kernel's scratch (`winograd.Scratch`, rn12): temporaries kept for the next call,
one zero-bordered padded input per geometry whose border is zeroed once. Since scratch12 a
scratch belongs to its owner (a compiled program, `test_scratch12_program.py`; here, layers
given one); a layer given none makes its own.

Oracle: float64 `F.conv2d` (torch's direct convolution), and the old path
(`PGX_WINOGRAD_SCRATCH=0`, every temporary allocated anew) for bit-equality.
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from pygraphx.targets.torch_lowering import winograd, winograd_native  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan  # noqa: E402


@pytest.fixture(autouse=True)
def _torch_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of the torch-ops route's temporaries (the native F(4,3) kernel, wino13,
    keeps only its block buffers in the scratch: `test_native_winograd.py`)."""
    monkeypatch.setenv(winograd_native.NATIVE_ENV, "0")


def _plan(c: int, k: int, lens: list[int], seed: int, pre_pad: list[int] | None = None) -> object:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(k, c, 3, 3, generator=gen) / 8
    bias = torch.randn(k, generator=gen)
    plan = ConvPlan(w, w, lens, [1, 1], [1, 1], [1, 1], 1, None, bias=bias, unary="relu")
    if pre_pad is not None:
        plan.pre_pad = pre_pad
    return plan


def _want(plan: object, x: torch.Tensor) -> torch.Tensor:
    xd = x.double()
    if plan.pre_pad is not None:
        # the plan's lens include the pre-pad; x is the unpadded input
        xd = F.pad(xd, plan.pre_pad)
    return F.relu(F.conv2d(xd, plan.weight.double(), plan.bias.double(), padding=1))


def _input(lens: list[int], seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lens, generator=gen) * scale
    return x.contiguous(memory_format=torch.channels_last)


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("inference", [False, True])
def test_layers_sharing_a_geometry_stay_exact(inference: bool) -> None:
    lens = [2, 16, 9, 10]
    a, b = _plan(16, 24, lens, 1), _plan(16, 8, lens, 2)
    scratch = winograd.Scratch()
    with torch.inference_mode(inference):
        run_a = winograd.build(a, lambda: xs[0], None, scratch=scratch)
        run_b = winograd.build(b, lambda: xs[0], None, scratch=scratch)
        geo = winograd.geometry(a, 4)
        # one padded buffer for both (they differ in K only)
        assert scratch.padded(geo) is scratch.padded(winograd.geometry(b, 4))
        assert sum(key[0] == "flat" for key in scratch.bufs) == 1
        for seed, scale in ((3, 1.0), (4, 1e3), (5, 1.0)):
            xs = [_input(lens, seed, scale)]
            for plan, run in ((a, run_a), (b, run_b)):
                assert _err(run(), _want(plan, xs[0])) < 3e-5
        flat = scratch.padded(geo).view(geo.n, geo.hp, geo.wp, geo.c)
        interior = torch.zeros_like(flat, dtype=torch.bool)
        interior[:, geo.top : geo.top + geo.h, geo.left : geo.left + geo.w] = True
        assert bool((flat[~interior] == 0).all())  # the border: zero after 1e3-scaled inputs


def test_pre_padded_geometry() -> None:
    # lens of the padded input (pre_pad: left, right, top, bottom = 0, 1, 2, 1)
    plan = _plan(12, 12, [1, 12, 11, 9], 6, pre_pad=[0, 1, 2, 1])
    x = _input([1, 12, 8, 8], 7, 1e2)
    run = winograd.build(plan, lambda: x, None)
    assert _err(run(), _want(plan, x)) < 3e-5


def test_scratch_and_fresh_paths_agree_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    lens = [3, 20, 13, 11]
    plan = _plan(20, 24, lens, 8)
    x = _input(lens, 9)
    monkeypatch.setenv(winograd.SCRATCH_ENV, "0")
    fresh = winograd.build(plan, lambda: x, None)
    monkeypatch.setenv(winograd.SCRATCH_ENV, "1")
    kept = winograd.build(plan, lambda: x, None)
    given = winograd.Scratch()
    assert winograd.Winograd(plan, 4, given).scratch is given
    own = [winograd.Winograd(plan, 4).scratch for _ in range(2)]  # each its own
    assert isinstance(own[0], winograd.Scratch) and own[0] is not own[1]
    monkeypatch.setenv(winograd.SCRATCH_ENV, "0")
    assert winograd.Winograd(plan, 4).scratch is None
    assert winograd.Winograd(plan, 4, given).scratch is None
    y_fresh, y_kept = fresh().clone(), kept().clone()
    assert _err(y_kept, _want(plan, x)) < 3e-5
    assert torch.equal(y_fresh, y_kept)


def test_two_threads_keep_their_own_scratch() -> None:
    # two layers made without a scratch (as a candidate timed at compile) own one each, so
    # two threads may run them at once
    lens = [1, 16, 12, 12]
    plan = _plan(16, 16, lens, 10)
    inputs = [_input(lens, 11, 1.0), _input(lens, 12, 50.0)]
    wants = [_want(plan, x) for x in inputs]
    runs = [winograd.build(plan, lambda x=x: x, None) for x in inputs]
    start = threading.Barrier(2)
    errors: list[float] = [0.0, 0.0]

    def work(i: int) -> None:
        start.wait()
        for _ in range(30):
            errors[i] = max(errors[i], _err(runs[i](), wants[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(errors) < 3e-5, errors
