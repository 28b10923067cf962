"""`conv_choice.impl_candidates` on several threads: a 1x1 layer with a tiny output (at most
`TINY_1X1_PIXELS` pixels in all, a 7x7 map at batch 1) has its oneDNN implementations timed
whatever its channels; on one thread, or with a larger output, the wide-layer rule holds. A
layer run on its chosen implementation matches torch's float64 convolution."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pygraphx.targets.torch_lowering import conv_choice, onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan, build_kernel  # noqa: E402

pytestmark = pytest.mark.skipif(
    not onednn_conv.available(), reason="needs oneDNN's C API library (onednn-cpu-gomp)"
)
CL = torch.channels_last


def plan(batch: int, c: int, k: int, hw: int) -> ConvPlan:
    w = torch.randn(k, c, 1, 1) / c**0.5
    return ConvPlan(weight=w, packed=w, x_lens=[batch, c, hw, hw], padding=[0, 0],
                    stride=[1, 1], dilation=[1, 1], groups=1, pre_pad=None,
                    bias=torch.randn(k), kernel="dnnl")  # fmt: skip


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_tiny_wide_1x1_layer_timed_on_several_threads_only(threads):
    tiny = plan(1, 192, 96, 7)
    threads(1)
    assert conv_choice.impl_candidates(tiny, False) == []
    threads(2)
    names = conv_choice.impl_candidates(tiny, False)
    assert names and all(n.startswith("dnnl/") and "1x1" in n for n in names)
    assert conv_choice.impl_candidates(plan(2, 192, 96, 7), False) == []  # 98 pixels
    assert conv_choice.impl_candidates(plan(1, 192, 96, 14), False) == []


def test_each_candidate_of_a_tiny_layer_matches_torch(threads):
    threads(2)
    p = plan(1, 96, 80, 7)
    x = torch.randn(p.x_lens).contiguous(memory_format=CL)
    want = torch.nn.functional.conv2d(x.double(), p.weight.double(), p.bias.double())
    for name in conv_choice.impl_candidates(p, False):
        impl = name.partition(conv_choice.IMPL_SEP)[2]
        run = build_kernel(replace(p, impl=impl), "dnnl", lambda: x, None)
        assert run.primitives[2].impl == impl
        np.testing.assert_allclose(run().double().numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
