"""The Winograd products' oneDNN matmul with its weight packed once (`onednn_bmm.py`).

Oracle: a float64 `torch.bmm` of the same operands. The weight is kept only in the layouts
the primitives chose: checked for several row and thread counts (a primitive each), for one
buffer shared where the layouts agree, and for a reorder of a packed weight into another
layout (the path a primitive choosing a different layout takes).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pygraphx.targets.torch_lowering import onednn_bmm, onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_capi import F32  # noqa: E402

needs_onednn = pytest.mark.skipif(
    not onednn_conv.available(), reason="oneDNN's C API library (onednn-cpu-gomp) not installed"
)


def _check(mm: onednn_bmm.BatchedMatmul, weight: torch.Tensor, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    src = torch.randn(weight.shape[0], rows, weight.shape[1], generator=gen)
    want = torch.bmm(src.double(), weight.double())
    # float32 sums of C terms of about unit size: within ~C * 2^-24 of float64 (bounded here
    # by 1e-5 per 40 terms, as `test_winograd.test_batched_matmul_matches_float64`)
    tol = 1e-5 * max(1.0, weight.shape[1] / 40)
    torch.testing.assert_close(mm(src).double(), want, rtol=1e-5, atol=tol)


@needs_onednn
@pytest.mark.parametrize("shape", [(36, 64, 96), (16, 40, 24), (3, 200, 130)])
def test_packed_products_match_float64(shape: tuple[int, int, int]) -> None:
    weight = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))
    mm = onednn_bmm.BatchedMatmul(weight.clone())
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for rows in (4, 33, 700, 4):
                _check(mm, weight, rows)
    finally:
        torch.set_num_threads(threads)
    assert mm.weight is None, "the row-major weight is kept after packing"
    layouts = {}
    for prim in mm._made.values():
        key = next(
            (k for k in layouts if mm.rt.lib.dnnl_memory_desc_equal(k.w_md, prim.w_md)), prim
        )
        layouts.setdefault(key, set()).add(prim.weight.data_ptr())
    assert all(len(ptrs) == 1 for ptrs in layouts.values()), "one layout, two packed copies"


@needs_onednn
def test_reorder_from_a_packed_weight() -> None:
    weight = torch.randn(4, 48, 80, generator=torch.Generator().manual_seed(1))
    mm = onednn_bmm.BatchedMatmul(weight.clone())
    _check(mm, weight, 9)
    plain = mm.rt.desc(list(weight.shape), F32, onednn_bmm.TAG_ABC)
    try:
        again = mm._pack(plain)  # row-major again, from the packed copy
    finally:
        mm.rt.lib.dnnl_memory_desc_destroy(plain)
    got = again.view(torch.float32)[: weight.numel()].view(weight.shape)
    torch.testing.assert_close(got, weight, rtol=0, atol=0)
