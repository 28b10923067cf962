"""Dynamic batching and the server's production behaviour: 32 concurrent clients lose nothing
and are batched, an error reaches only its own request, a full queue answers 429 /
RESOURCE_EXHAUSTED, a late request 504, shutdown finishes the requests in flight, and compiled
programs are cached next to the model. Oracle: ONNX Runtime on each request alone."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import pygraphx

pytest.importorskip("fastapi")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
ort = pytest.importorskip("onnxruntime")

from tritonclient.utils import InferenceServerException  # noqa: E402

from pygraphx.serve.config import scan_repository  # noqa: E402
from pygraphx.serve.core import InferenceServer  # noqa: E402
from pygraphx.serve.server import ServerThread  # noqa: E402
from tests.serve.helpers import add_model, bert_inputs, image, mobilenet, running, tiny_bert  # noqa: E402

BERT_OUT = ["last_hidden_state", "pooler_output"]


def _infer(module, port: int, model: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    client = module.InferenceServerClient(f"127.0.0.1:{port}")
    inputs = []
    for name, arr in arrays.items():
        inp = module.InferInput(
            name, list(arr.shape), "FP32" if arr.dtype == np.float32 else "INT64"
        )
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    result = client.infer(model, inputs)
    names = BERT_OUT if model.startswith("bert") else ["output"]
    return {n: result.as_numpy(n) for n in names}


def _ort_rows(session, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    rows = next(iter(arrays.values())).shape[0]
    outs = [session.run(None, {k: v[r : r + 1] for k, v in arrays.items()}) for r in range(rows)]
    return [np.concatenate(o) for o in zip(*outs, strict=True)]


@pytest.fixture(scope="module")
def bert_server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("batching")
    path = add_model(root, "bert", tiny_bert(), max_batch=8, batch_window_us=20000)
    with running(root) as (server, ports):
        yield server, ports, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_32_concurrent_clients_lose_nothing_and_are_batched(bert_server) -> None:
    server, ports, session = bert_server
    jobs = [(k, 1 + k % 2) for k in range(96)]  # 32 clients x 3 requests, 1 or 2 rows

    def client(k: int, rows: int) -> tuple[int, dict[str, np.ndarray]]:
        if k % 2:
            return k, _infer(grpcclient, ports.grpc, "bert", bert_inputs(rows, k))
        return k, _infer(httpclient, ports.http, "bert", bert_inputs(rows, k))

    with ThreadPoolExecutor(32) as pool:
        results = dict(pool.map(lambda job: client(*job), jobs))
    assert sorted(results) == list(range(96))
    for k, rows in jobs:
        expected = _ort_rows(session, bert_inputs(rows, k))
        for name, want in zip(BERT_OUT, expected, strict=True):
            assert results[k][name].shape == want.shape
            np.testing.assert_allclose(results[k][name], want, rtol=1e-3, atol=1e-4)
    registry = server.metrics.registry
    batches = registry.get_sample_value("pgx_batch_size_count", {"model": "bert"})
    rows_run = registry.get_sample_value("pgx_batch_size_sum", {"model": "bert"})
    assert rows_run >= sum(r for _, r in jobs)
    assert batches < len(jobs), "no two requests were ever run as one batch"


def test_an_error_fails_only_its_own_request(bert_server, caplog) -> None:
    server, _, session = bert_server
    loop = server.batchers["bert"]._workers[0].get_loop()
    good = [bert_inputs(1, k) for k in range(6)]
    bad_index = bert_inputs(1, 99)
    bad_index["input_ids"][0, 0] = 10**6  # out of the vocabulary: the batch's Gather fails

    async def all_at_once():
        requests = [server.infer("bert", "", g, []) for g in good[:3]]
        requests += [server.infer("bert", "", bad_index, [])]
        requests += [server.infer("bert", "", g, []) for g in good[3:]]
        return await asyncio.gather(*requests, return_exceptions=True)

    with caplog.at_level(logging.WARNING, logger="pygraphx.serve"):
        results = asyncio.run_coroutine_threadsafe(all_at_once(), loop).result(60)
    # the run's error names the instruction (pygraphx.EvaluationError, the IndexError its cause)
    assert isinstance(results[3], pygraphx.EvaluationError), results[3]
    assert "out of range" in str(results[3]) and "gather" in str(results[3])
    for arrays, got in zip(good, results[:3] + results[4:], strict=True):
        assert isinstance(got, dict), got
        want = _ort_rows(session, arrays)
        np.testing.assert_allclose(got["pooler_output"], want[1], rtol=1e-3, atol=1e-4)
    assert any("one by one" in r.getMessage() for r in caplog.records)


@pytest.fixture(scope="module")
def small_queue(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("queue")
    model = mobilenet()
    add_model(root, "full", model, max_batch=1, dynamic_batching=False, queue_size=2)
    add_model(root, "late", model, max_batch=1, dynamic_batching=False, timeout_s=0.05)
    with running(root) as (server, ports):
        yield server, ports


def _statuses(fn, count: int) -> list[str]:
    def one(k: int) -> str:
        try:
            fn(k)
            return "ok"
        except InferenceServerException as exc:
            return str(exc.status())

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def test_a_full_queue_answers_429_and_resource_exhausted(small_queue) -> None:
    _, ports = small_queue
    http = _statuses(lambda k: _infer(httpclient, ports.http, "full", {"input": image(1, k)}), 16)
    assert "429" in http and "ok" in http and set(http) <= {"ok", "429"}, http
    grpc = _statuses(lambda k: _infer(grpcclient, ports.grpc, "full", {"input": image(1, k)}), 16)
    assert "StatusCode.RESOURCE_EXHAUSTED" in grpc and "ok" in grpc, grpc
    assert set(grpc) <= {"ok", "StatusCode.RESOURCE_EXHAUSTED"}, grpc


def test_a_request_waiting_past_its_timeout_answers_504(small_queue) -> None:
    _, ports = small_queue
    http = _statuses(lambda k: _infer(httpclient, ports.http, "late", {"input": image(1, k)}), 12)
    assert "504" in http and set(http) <= {"ok", "504"}, http


def test_shutdown_finishes_the_requests_in_flight(tmp_path) -> None:
    add_model(tmp_path, "mobilenet", mobilenet(), max_batch=1, dynamic_batching=False)
    server = InferenceServer.load(scan_repository(tmp_path))
    thread = ServerThread(server, http_port=0, grpc_port=0)
    ports = thread.start()
    with ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(_infer, httpclient, ports.http, "mobilenet", {"input": image(1, k)})
            for k in range(8)
        ]
        deadline = time.monotonic() + 30
        while server.in_flight < 8 and time.monotonic() < deadline:
            time.sleep(0.005)
        thread.stop()
        results = [f.result(60) for f in futures]
    assert all(r["output"].shape == (1, 1000) for r in results)
    assert not server.ready() and not server.live
    with pytest.raises(Exception, match="refused|Connection|connect"):
        httpclient.InferenceServerClient(f"127.0.0.1:{ports.http}").is_server_live()


def test_compiled_programs_are_cached_next_to_the_model(tmp_path, caplog) -> None:
    add_model(tmp_path, "bert", tiny_bert(), max_batch=2)
    with caplog.at_level(logging.INFO, logger="pygraphx.serve"):
        InferenceServer.load(scan_repository(tmp_path))
    cached = sorted((tmp_path / "bert").glob("model.b*.cpu.fp32.O.*.cache.pgx"))
    assert [p.name.split(".")[1] for p in cached] == ["b1", "b2"]
    assert sum(r.getMessage().startswith("compiled") for r in caplog.records) == 2
    stamps = [p.stat().st_mtime_ns for p in cached]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pygraphx.serve"):
        again = InferenceServer.load(scan_repository(tmp_path))
    assert not any(r.getMessage().startswith("compiled") for r in caplog.records)
    assert [p.stat().st_mtime_ns for p in cached] == stamps
    assert again.models["bert"].programs[0][2].is_compiled()
