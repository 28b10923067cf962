"""Helper review18b's repros (review of gemm18 and norms18), each against ONNX Runtime.

Both fused native steps of norms18 check the layout of a *program input* they read directly
and raise where it is a valid but non-contiguous numpy array, which `Program.run` passes
through as it is (`CpuExecutable.bind` -> `dtypes.env_value`: no copy), while the unfused
steps (`PGX_CPU_EMBED_NORM=0` / `PGX_CPU_NORM_POOL=0`) and ONNX Runtime take it:

* `embed_norm.Embed.__call__` requires `ids.is_contiguous()`: ids sliced from a longer padded
  batch (`ids[:, :T]`, row stride > T) or in Fortran order raise "not as lowered".
* `norm_pool.Pool.__call__` requires `mask.stride(1) == 1`: an attention mask in Fortran order
  (int64, the mean's tail read as it is; or float32, the unsqueezed input read as the mask)
  raises "not as lowered".

Fixed (the lead, session 18): both steps copy such an input to a dense one (a B x T array, small
next to the step). The tests were xfail(strict=True) repros before; each also runs the switch-off
path to show the old steps take the same input.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import embed_norm, native_layernorm, norm_pool  # noqa: E402
from tests.targets.test_norms18_embed_norm import embeddings  # noqa: E402
from tests.targets.test_norms18_norm_pool import encoder_pool  # noqa: E402


def _native_or_skip() -> None:
    try:
        native_layernorm.library()
    except native.NativeUnavailable as exc:
        pytest.skip(str(exc))


def _against_ort(model, feeds: dict, threads: int, key: str) -> int:
    """Compile, run `feeds` (as given: strided arrays stay strided), compare with ORT; the
    number of fused steps counted under `key`."""
    data = model.SerializeToString()
    want = ort.InferenceSession(data).run(None, feeds)
    prog = pygraphx.parse_onnx_buffer(data)
    prog.compile(CpuTarget(threads=threads))
    got = prog.run(feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-5)
    return prog._executable.lowered.ctx.cache.get(key, 0)


def _column_sliced(a: np.ndarray) -> np.ndarray:
    """`a`'s values as the first columns of a wider array (a padded batch cut to length)."""
    wide = np.concatenate([a, a[:, :5]], axis=1)
    out = wide[:, : a.shape[1]]
    assert not out.flags.c_contiguous and out.strides[1] == a.itemsize
    return out


@pytest.mark.parametrize("layout", ["sliced", "fortran"])
@pytest.mark.parametrize("threads", [1, 2])
def test_embed_norm_strided_ids_against_ort(monkeypatch, threads: int, layout: str) -> None:
    _native_or_skip()
    model, feeds = embeddings(3, 19, "bert")
    strided = {k: _column_sliced(v) if layout == "sliced" else np.asfortranarray(v)
               for k, v in feeds.items()}  # fmt: skip
    monkeypatch.setenv(embed_norm.ENV, "0")  # the old steps take it
    assert _against_ort(model, strided, threads, embed_norm.BLOCKS) == 0
    monkeypatch.setenv(embed_norm.ENV, "1")
    assert _against_ort(model, strided, threads, embed_norm.BLOCKS) == 1


def _pool_model(mask_type: str) -> tuple:
    model, h, mask = encoder_pool(3, 19, True)
    if mask_type == "float":
        graph = model.graph
        next(i for i in graph.input if i.name == "mask").type.tensor_type.elem_type = (
            TensorProto.FLOAT
        )
        for node in graph.node:
            if node.op_type == "Cast":
                node.attribute[0].i = TensorProto.FLOAT
        mask = mask.astype(np.float32)
    return model, h, mask


@pytest.mark.parametrize("mask_type", ["int64", "float"])
@pytest.mark.parametrize("threads", [1, 2])
def test_norm_pool_fortran_mask_against_ort(monkeypatch, threads: int, mask_type: str) -> None:
    _native_or_skip()
    model, h, mask = _pool_model(mask_type)
    feeds = {"h": h, "mask": np.asfortranarray(mask)}
    assert not feeds["mask"].flags.c_contiguous
    monkeypatch.setenv(norm_pool.ENV, "0")  # the old steps take it
    assert _against_ort(model, feeds, threads, norm_pool.BLOCKS) == 0
    monkeypatch.setenv(norm_pool.ENV, "1")
    assert _against_ort(model, feeds, threads, norm_pool.BLOCKS) == 1
