"""Issue 14's acceptance check: the official Triton clients (`tritonclient.http` and `.grpc`)
query health and metadata of a served ResNet-50 and BERT-base and get outputs equal to
`Program.run` on the same ONNX file (and close to ONNX Runtime)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
ort = pytest.importorskip("onnxruntime")

from pygraphx.models import get_model, model_inputs  # noqa: E402
from tests.serve.helpers import add_model, reference_run, running  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("real")
    models = {"resnet50": get_model("resnet50"), "bert_base": get_model("bert_base", seq_len=32)}
    paths = {name: add_model(root, name, m, max_batch=1) for name, m in models.items()}
    # Each convolution's kernel is chosen by timing it, and a run on a loaded machine may take
    # fewer threads (another kernel plan), so two compiles or runs under load can differ by
    # 1e-6; the bit-equality below compares the server's run with this thread's, so both
    # take the default kernels and the full thread count.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PGX_CONV_KERNEL", "off")
        env.setenv("PGX_CPU_LOAD_ADAPT", "0")
        with running(root) as (server, ports):
            yield ports, paths, models


def _client_inputs(module, arrays: dict[str, np.ndarray]) -> list:
    out = []
    for name, arr in arrays.items():
        out.append(
            module.InferInput(name, list(arr.shape), "FP32" if arr.dtype == np.float32 else "INT64")
        )
        out[-1].set_data_from_numpy(arr)
    return out


@pytest.mark.parametrize("name", ["resnet50", "bert_base"])
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_triton_clients_get_program_run_results(served, name: str, module) -> None:
    ports, paths, models = served
    port = ports.http if module is httpclient else ports.grpc
    client = module.InferenceServerClient(f"127.0.0.1:{port}")
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(name)
    meta = client.get_model_metadata(name, **({} if module is httpclient else {"as_json": True}))
    graph = models[name].graph
    assert [i["name"] for i in meta["inputs"]] == [i.name for i in graph.input]
    assert [o["name"] for o in meta["outputs"]] == [o.name for o in graph.output]
    arrays = model_inputs(name, models[name], seed=3)
    result = client.infer(name, _client_inputs(module, arrays))
    expected = reference_run(paths[name], arrays)
    session = ort.InferenceSession(str(paths[name]), providers=["CPUExecutionProvider"])
    peer = session.run(None, arrays)
    for out, want, other in zip(graph.output, expected, peer, strict=True):
        np.testing.assert_array_equal(result.as_numpy(out.name), want)
        np.testing.assert_allclose(result.as_numpy(out.name), other, rtol=1e-3, atol=1e-3)
