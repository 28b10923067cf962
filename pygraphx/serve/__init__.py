"""Serving pygraphx models: the KServe v2 / Open Inference Protocol over HTTP and gRPC.

    pygraphx-driver serve --model-repository models/ --http-port 8000 --grpc-port 8001

Layer: above `onnx`, `models`, `quantize` and `targets`, below `driver`. Modules:
`config` (repository and per-model settings), `model` (compiled programs per batch size and
their disk cache), `batcher` (bounded queue and dynamic batching), `core` (the models, readiness
and metadata), `protocol` (tensor encodings), `http_app` (FastAPI), `grpc_server` (grpcio),
`metrics` (Prometheus), `server` (runs both front ends and shuts them down), `ray` (Ray Serve
and Ray Data adapters). Needs the `serve` extra: `pip install 'pygraphx[serve]'`.
"""
