"""The server through the official Triton/KServe clients (`tritonclient.http` and `.grpc`):
health, metadata, readiness, and inference on MobileNetV2 and a small BERT that matches
`Program.run` on the same file exactly and ONNX Runtime within float tolerance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
ort = pytest.importorskip("onnxruntime")

from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.serve.helpers import (  # noqa: E402
    add_model,
    bert_inputs,
    image,
    mobilenet,
    reference_run,
    running,
    tiny_bert,
)

LIMIT = 4 << 20


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("repo")
    paths = {
        "mobilenet": add_model(root, "mobilenet", mobilenet(), max_batch=4),
        "bert": add_model(root, "bert", tiny_bert(), max_batch=4),
    }
    with running(root, max_body_bytes=LIMIT) as (server, ports):
        yield server, ports, paths


def _http(ports) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{ports.http}")


def _grpc(ports) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc}")


def _inputs(module, arrays: dict[str, np.ndarray], binary: bool = True) -> list:
    out = []
    for name, arr in arrays.items():
        inp = module.InferInput(
            name, list(arr.shape), "FP32" if arr.dtype == np.float32 else "INT64"
        )
        if module is httpclient:
            inp.set_data_from_numpy(arr, binary_data=binary)
        else:
            inp.set_data_from_numpy(arr)
        out.append(inp)
    return out


def _ort(path: Path, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime, one row at a time (the models declare batch 1), rows concatenated."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rows = next(iter(arrays.values())).shape[0]
    per_row = [session.run(None, {k: v[r : r + 1] for k, v in arrays.items()}) for r in range(rows)]
    return [np.concatenate(outs) for outs in zip(*per_row, strict=True)]


def test_health_and_metadata_over_http_and_grpc(served) -> None:
    _, ports, _ = served
    h, g = _http(ports), _grpc(ports)
    assert h.is_server_live() and h.is_server_ready()
    assert g.is_server_live() and g.is_server_ready()
    assert h.is_model_ready("mobilenet") and g.is_model_ready("bert")
    assert not h.is_model_ready("nonexistent") and not g.is_model_ready("nonexistent")
    assert h.get_server_metadata()["name"] == "pygraphx"
    assert "binary_tensor_data" in g.get_server_metadata(as_json=True)["extensions"]
    meta = h.get_model_metadata("mobilenet")
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 224, 224]}]
    assert meta["outputs"][0]["shape"] == [-1, 1000]
    gmeta = g.get_model_metadata("bert", as_json=True)
    assert [i["name"] for i in gmeta["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert gmeta["inputs"][0]["datatype"] == "INT64"
    assert [o["name"] for o in gmeta["outputs"]] == ["last_hidden_state", "pooler_output"]
    with pytest.raises(InferenceServerException, match="not served"):
        h.get_model_metadata("nonexistent")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_mobilenet_matches_program_run_exactly(served, binary: bool) -> None:
    _, ports, paths = served
    x = image(1, seed=1)
    outputs = [httpclient.InferRequestedOutput("output", binary_data=binary)]
    result = _http(ports).infer(
        "mobilenet", _inputs(httpclient, {"input": x}, binary), outputs=outputs
    )
    got = result.as_numpy("output")
    np.testing.assert_array_equal(got, reference_run(paths["mobilenet"], {"input": x})[0])
    np.testing.assert_allclose(got, _ort(paths["mobilenet"], {"input": x})[0], rtol=1e-3, atol=1e-4)


def test_grpc_bert_matches_program_run_exactly(served) -> None:
    _, ports, paths = served
    arrays = bert_inputs(1, seed=2)
    result = _grpc(ports).infer("bert", _inputs(grpcclient, arrays))
    expected = reference_run(paths["bert"], arrays)
    peer = _ort(paths["bert"], arrays)
    for k, name in enumerate(["last_hidden_state", "pooler_output"]):
        np.testing.assert_array_equal(result.as_numpy(name), expected[k])
        np.testing.assert_allclose(result.as_numpy(name), peer[k], rtol=1e-3, atol=1e-4)


def test_a_request_of_several_rows_and_a_chosen_output(served) -> None:
    _, ports, paths = served
    arrays = bert_inputs(3, seed=3)
    outputs = [httpclient.InferRequestedOutput("pooler_output")]
    result = _http(ports).infer("bert", _inputs(httpclient, arrays), outputs=outputs)
    assert result.as_numpy("last_hidden_state") is None
    got = result.as_numpy("pooler_output")
    assert got.shape == (3, 32)
    np.testing.assert_allclose(got, _ort(paths["bert"], arrays)[1], rtol=1e-3, atol=1e-4)


def test_bad_requests_name_the_problem(served) -> None:
    _, ports, _ = served
    h, g = _http(ports), _grpc(ports)
    wrong_shape = {"input": image(1, 0)[:, :, :100]}
    with pytest.raises(InferenceServerException, match=r"expects shape \[-1, 3, 224, 224\]"):
        h.infer("mobilenet", _inputs(httpclient, wrong_shape))
    with pytest.raises(InferenceServerException, match="INVALID_ARGUMENT|expects shape"):
        g.infer("mobilenet", _inputs(grpcclient, wrong_shape))
    too_many = {"input": image(5, 0)}
    with pytest.raises(InferenceServerException, match=r"outside 1..4"):
        h.infer("mobilenet", _inputs(httpclient, too_many))
    with pytest.raises(InferenceServerException, match="not served"):
        g.infer("resnet", _inputs(grpcclient, {"input": image(1, 0)}))


def test_request_over_the_size_limit_is_refused(served) -> None:
    _, ports, _ = served
    big = {"input": np.zeros((LIMIT // 4 + 1,), np.float32)}
    with pytest.raises(InferenceServerException) as info:
        _http(ports).infer("mobilenet", _inputs(httpclient, big))
    assert info.value.status() == "413" or "over the limit" in str(info.value)
    with pytest.raises(InferenceServerException, match="RESOURCE_EXHAUSTED|larger than max"):
        _grpc(ports).infer("mobilenet", _inputs(grpcclient, big))


def test_metrics_count_requests_and_batches(served) -> None:
    _, ports, _ = served
    _http(ports).infer("bert", _inputs(httpclient, bert_inputs(1, 4)))
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{ports.http}/metrics").read().decode()
    assert 'pgx_inference_requests_total{model="bert",protocol="http",status="200"}' in text
    for name in ("pgx_request_latency_seconds_bucket", "pgx_batch_size_count", "pgx_queue_depth"):
        assert name in text


def test_grpc_typed_contents_are_accepted(served) -> None:
    """KServe clients other than Triton's may send `contents` instead of raw bytes."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    _, ports, paths = served
    arrays = bert_inputs(1, seed=6)
    request = service_pb2.ModelInferRequest(model_name="bert")
    for name, arr in arrays.items():
        tensor = request.inputs.add(name=name, datatype="INT64", shape=list(arr.shape))
        tensor.contents.int64_contents.extend(arr.ravel().tolist())
    request.outputs.add(name="pooler_output")
    with grpc.insecure_channel(f"127.0.0.1:{ports.grpc}") as channel:
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert [o.name for o in reply.outputs] == ["pooler_output"]
    got = np.frombuffer(reply.raw_output_contents[0], np.float32).reshape(1, -1)
    np.testing.assert_array_equal(got, reference_run(paths["bert"], arrays)[1])


def test_a_saved_program_is_served_as_saved(tmp_path: Path) -> None:
    from pygraphx.ir.serialize import save
    from pygraphx.onnx import parse_onnx
    from pygraphx.targets import get_target

    onnx_path = add_model(tmp_path / "src", "bert", tiny_bert())
    program = parse_onnx(onnx_path)
    program.compile(get_target("ref"))
    (tmp_path / "repo" / "saved").mkdir(parents=True)
    save(program, tmp_path / "repo" / "saved" / "bert.pgx")
    arrays = bert_inputs(1, seed=9)
    with running(tmp_path / "repo") as (server, ports):
        assert server.models["saved"].max_batch == 0  # shapes fixed by the file
        meta = _http(ports).get_model_metadata("saved")
        assert meta["platform"] == "pygraphx_ref" and meta["inputs"][0]["shape"] == [1, 8]
        got = _http(ports).infer("saved", _inputs(httpclient, arrays)).as_numpy("pooler_output")
    want = _ort(onnx_path, arrays)[1]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
