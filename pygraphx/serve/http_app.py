"""The KServe v2 HTTP/REST front end: a FastAPI application over an `InferenceServer`.

Routes: `/v2/health/live`, `/v2/health/ready`, `/v2` (server metadata), `/v2/models/{m}`
(`/versions/{v}`): metadata, `.../ready`, `.../infer` (JSON, or JSON + binary tensors with
`Inference-Header-Content-Length`), and `/metrics` (Prometheus). Errors answer
`{"error": message}` with 400 (bad request), 404 (unknown model), 413 (body over the limit),
429 (queue full), 503 (shutting down), 504 (timed out) or 500.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from pygraphx.serve.batcher import QueueFullError, ShuttingDownError
from pygraphx.serve.core import InferenceServer, ModelNotFoundError
from pygraphx.serve.model import RequestError
from pygraphx.serve.protocol import HEADER_LENGTH, ProtocolError, decode_http, encode_http

log = logging.getLogger("pygraphx.serve")

#: exception type -> HTTP status of the answer
STATUS: list[tuple[type[BaseException], int]] = [
    (ProtocolError, 400),
    (RequestError, 400),
    (ModelNotFoundError, 404),
    (QueueFullError, 429),
    (ShuttingDownError, 503),
    (TimeoutError, 504),
]


class BodyTooLarge(ValueError):
    """The request body is over the server's limit."""


def status_of(exc: BaseException) -> int:
    """The HTTP status for an exception raised while answering a request."""
    for kind, status in STATUS:
        if isinstance(exc, kind):
            return status
    return 413 if isinstance(exc, BodyTooLarge) else 500


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes is over the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(server: InferenceServer, max_body_bytes: int = 64 << 20) -> FastAPI:
    """The FastAPI application serving `server`."""
    app = FastAPI(title="pygraphx KServe v2", docs_url=None, redoc_url=None)

    @app.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200 if server.live else 503)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200 if server.ready() else 503)

    @app.get("/v2")
    async def server_metadata() -> JSONResponse:
        return JSONResponse(server.server_metadata())

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.exposition(), media_type=server.metrics.content_type)

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str = "") -> JSONResponse:
        try:
            return JSONResponse(server.model_metadata(name, version))
        except ModelNotFoundError as exc:
            return _error(404, str(exc))

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str = "") -> Response:
        return Response(status_code=200 if server.model_ready(name, version) else 400)

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str = "") -> Response:
        return await _infer(server, name, version, request, max_body_bytes)

    return app


async def _infer(
    server: InferenceServer, name: str, version: str, request: Request, limit: int
) -> Response:
    start = time.perf_counter()
    status = 200
    try:
        body = await _read_body(request, limit)
        length = request.headers.get(HEADER_LENGTH)
        req = decode_http(body, int(length) if length is not None and length.isdigit() else None)
        outputs = await server.infer(name, version, req.inputs, req.outputs)
        model = server.model(name, version)
        data, header_length = encode_http(model.name, model.config.version, req, outputs)
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - every failure is answered with its status
        status = status_of(exc)
        if status == 500:
            log.exception("model %s: internal error answering a request", name)
        return _error(status, str(exc) or type(exc).__name__)
    finally:
        server.metrics.requests.labels(name, "http", str(status)).inc()
        log.debug("http infer %s -> %d in %.4fs", name, status, time.perf_counter() - start)
    if header_length is None:
        return Response(data, media_type="application/json")
    headers = {HEADER_LENGTH: str(header_length)}
    return Response(data, media_type="application/octet-stream", headers=headers)
