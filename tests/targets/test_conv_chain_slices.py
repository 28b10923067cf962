"""`conv_chain`: a chain member reading a channel slice of an earlier member's result (a
YOLOv8 C2f block's split), which the member copies to channels-last each run: the copy must
read this run's result, not the slot before the chain ran. Against ONNX Runtime over runs on
new inputs (the bug gave the previous run's numbers)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

from pygraphx.targets.torch_lowering import onednn_conv  # noqa: E402
from tests.helpers import make_model  # noqa: E402
from tests.targets.test_chain11_chain import _compiled  # noqa: E402

pytestmark = pytest.mark.skipif(
    not onednn_conv.available(), reason="needs oneDNN's C API library (onednn-cpu-gomp)"
)


def _split_network(rng: np.random.Generator) -> object:
    """conv 1x1 -> relu -> split in two along the channels -> a 3x3 conv on the second half
    -> relu -> 1x1 conv."""
    x = rng.standard_normal((1, 8, 10, 10)).astype(np.float32)
    inits = {
        "w0": (rng.standard_normal((16, 8, 1, 1)) / 3).astype(np.float32),
        "w1": (rng.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32),
        "w2": (rng.standard_normal((8, 8, 1, 1)) / 3).astype(np.float32),
        "split": np.array([8, 8], dtype=np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Split", ["r", "split"], ["h0", "h1"], axis=1),
        helper.make_node("Conv", ["h1", "w1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["d"]),
        helper.make_node("Conv", ["d", "w2"], ["y"]),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits)


@pytest.mark.parametrize("chain", [True, False])
def test_member_reads_this_runs_slice(chain: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(23)
    model = _split_network(rng)
    prog = _compiled(model, chain, monkeypatch)
    chains = [c for c in prog._executable.chained.chains if c is not None]
    if chain:
        assert chains and max(len(c) for c in chains) >= 2  # the slice's reader is chained
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(3):
        x = rng.standard_normal((1, 8, 10, 10)).astype(np.float32)
        got = np.array(prog.run({"x": x})[0])
        np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
