"""`pygraphx.serve.ray` on a local Ray cluster: a two-replica Ray Serve deployment answers the
same requests with the same results (equal to `Program.run` on the same file), over its handle
and over Ray Serve's HTTP proxy, and Ray Data's `map_batches` adds the model's outputs as
columns (compared with ONNX Runtime). Skipped without ray[serve,data]."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
pytest.importorskip("ray.data")
ort = pytest.importorskip("onnxruntime")

from pygraphx.serve.ray import deployment, map_batches  # noqa: E402
from tests.serve.helpers import add_model, bert_inputs, reference_run, tiny_bert  # noqa: E402

pytestmark = pytest.mark.slow  # a local Ray cluster: ~35 s on 2 cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("ray")
    path = add_model(root, "bert", tiny_bert(), max_batch=4, dynamic_batching=False)
    ray.init(
        num_cpus=4,  # logical slots for the controller, proxy and two replicas
        object_store_memory=128 << 20,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PGX_CPU_THREADS": "1"}},
    )
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield path, port
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_answer_the_same_requests_with_the_same_results(cluster) -> None:
    path, port = cluster
    app = deployment(path, num_replicas=2, ray_actor_options={"num_cpus": 0.5})
    handle = serve.run(app, name="bert", route_prefix="/bert")
    pids = {handle.metadata.remote().result()["pid"] for _ in range(40)}
    assert len(pids) == 2, "requests reached only one replica"
    arrays = bert_inputs(2, seed=7)
    expected = reference_run(path, arrays)
    answers = [handle.infer.remote(arrays) for _ in range(16)]
    for answer in answers:
        got = answer.result()
        np.testing.assert_array_equal(got["last_hidden_state"], expected[0])
        np.testing.assert_array_equal(got["pooler_output"], expected[1])
    doc = {
        "inputs": [
            {"name": k, "shape": list(v.shape), "datatype": "INT64", "data": v.ravel().tolist()}
            for k, v in arrays.items()
        ],
        "outputs": [{"name": "pooler_output"}],
    }
    request = urllib.request.Request(f"http://127.0.0.1:{port}/bert", json.dumps(doc).encode())
    reply = json.loads(urllib.request.urlopen(request, timeout=60).read())
    got = np.array(reply["outputs"][0]["data"], np.float32).reshape(2, -1)
    np.testing.assert_array_equal(got, expected[1])
    serve.delete("bert")


def test_autoscaling_settings_reach_the_deployment(cluster) -> None:
    path, _ = cluster
    auto = {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 4}
    app = deployment(path, autoscaling_config=auto)
    config = app._bound_deployment._deployment_config.autoscaling_config
    assert (config.min_replicas, config.max_replicas) == (1, 3)
    with pytest.raises(ValueError, match="not both"):
        deployment(path, num_replicas=2, autoscaling_config=auto)


def test_map_batches_adds_the_outputs_as_columns(cluster) -> None:
    path, _ = cluster
    arrays = bert_inputs(10, seed=8)
    dataset = ray.data.from_items(
        [{k: v[r] for k, v in arrays.items()} for r in range(10)], override_num_blocks=2
    )
    rows = map_batches(dataset, Path(path), config={"max_batch": 4}).take_all()
    pooled = np.stack([r["pooler_output"] for r in rows])
    ids = np.stack([r["input_ids"] for r in rows])
    order = [int(np.flatnonzero((arrays["input_ids"] == row).all(axis=1))[0]) for row in ids]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for got, r in zip(pooled, order, strict=True):
        want = session.run(["pooler_output"], {k: v[r : r + 1] for k, v in arrays.items()})[0]
        np.testing.assert_allclose(got[None], want, rtol=1e-3, atol=1e-4)
