"""The KServe v2 gRPC front end (`inference.GRPCInferenceService`) over an `InferenceServer`.

The message and service stubs are the ones `tritonclient[grpc]` ships (its `service_pb2` is
the KServe v2 protocol plus Triton's extensions), so no protoc step is needed; the extension
methods answer UNIMPLEMENTED. Implemented: ServerLive, ServerReady, ModelReady, ServerMetadata,
ModelMetadata and ModelInfer (tensors as `raw_input_contents` or typed `contents`). Errors:
INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED (queue full), UNAVAILABLE (shutting down),
DEADLINE_EXCEEDED (timed out), INTERNAL.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from pygraphx.serve.batcher import QueueFullError, ShuttingDownError
from pygraphx.serve.core import InferenceServer, ModelNotFoundError
from pygraphx.serve.model import RequestError
from pygraphx.serve.protocol import ProtocolError, datatype_of, dtype_of, from_raw, to_raw

log = logging.getLogger("pygraphx.serve")

CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (ProtocolError, grpc.StatusCode.INVALID_ARGUMENT),
    (RequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelNotFoundError, grpc.StatusCode.NOT_FOUND),
    (QueueFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ShuttingDownError, grpc.StatusCode.UNAVAILABLE),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
]

#: datatype -> the typed `InferTensorContents` field that carries it
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def code_of(exc: BaseException) -> grpc.StatusCode:
    for kind, code in CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def decode_inputs(request: pb.ModelInferRequest) -> dict[str, np.ndarray]:
    """The request's tensors: raw contents in input order, else the typed contents."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise ProtocolError(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    inputs = {}
    for k, t in enumerate(request.inputs):
        if raw:
            arr = from_raw(raw[k], t.datatype, list(t.shape), t.name)
        else:
            field = CONTENTS.get(t.datatype)
            if field is None:
                dtype_of(t.datatype, t.name)  # unknown datatypes get their own message
                raise ProtocolError(f"input {t.name!r}: {t.datatype} needs raw_input_contents")
            values = np.asarray(getattr(t.contents, field), dtype=dtype_of(t.datatype, t.name))
            if values.size != int(np.prod(t.shape)):
                raise ProtocolError(f"input {t.name!r}: {values.size} values for {list(t.shape)}")
            arr = values.reshape(list(t.shape))
        if t.name in inputs:
            raise ProtocolError(f"input {t.name!r} is given twice")
        inputs[t.name] = arr
    return inputs


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    """KServe v2 gRPC methods on an `InferenceServer`."""

    def __init__(self, server: InferenceServer) -> None:
        self.server = server

    async def ServerLive(self, request, context):  # noqa: N802 - the protocol's names
        return pb.ServerLiveResponse(live=self.server.live)

    async def ServerReady(self, request, context):  # noqa: N802
        return pb.ServerReadyResponse(ready=self.server.ready())

    async def ModelReady(self, request, context):  # noqa: N802
        return pb.ModelReadyResponse(ready=self.server.model_ready(request.name, request.version))

    async def ServerMetadata(self, request, context):  # noqa: N802
        return pb.ServerMetadataResponse(**self.server.server_metadata())

    async def ModelMetadata(self, request, context):  # noqa: N802
        try:
            meta = self.server.model_metadata(request.name, request.version)
        except ModelNotFoundError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        tensors = lambda items: [pb.ModelMetadataResponse.TensorMetadata(**t) for t in items]  # noqa: E731
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=tensors(meta["inputs"]),
            outputs=tensors(meta["outputs"]),
        )

    async def ModelInfer(self, request, context):  # noqa: N802
        name = request.model_name
        status = "OK"
        try:
            inputs = decode_inputs(request)
            wanted = [o.name for o in request.outputs]
            outputs = await self.server.infer(name, request.model_version, inputs, wanted)
            model = self.server.model(name, request.model_version)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is answered with its code
            code = code_of(exc)
            status = code.name
            if code is grpc.StatusCode.INTERNAL:
                log.exception("model %s: internal error answering a gRPC request", name)
            await context.abort(code, str(exc) or type(exc).__name__)
        finally:
            self.server.metrics.requests.labels(name, "grpc", status).inc()
        response = pb.ModelInferResponse(
            model_name=model.name, model_version=model.config.version, id=request.id
        )
        for out_name, arr in outputs.items():
            response.outputs.add(name=out_name, datatype=datatype_of(arr.dtype), shape=arr.shape)
            response.raw_output_contents.append(to_raw(arr))
        return response


def create_server(
    server: InferenceServer, host: str, port: int, max_message_bytes: int = 64 << 20
) -> grpc.aio.Server:
    """A `grpc.aio` server on `port` (0: any free port; the bound port is `bound_port`)."""
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
    aio_server = grpc.aio.server(options=options)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(server), aio_server)
    aio_server.bound_port = aio_server.add_insecure_port(f"{host}:{port}")
    return aio_server
