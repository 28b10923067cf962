"""The driver's `serve` command: serve models on the KServe v2 protocol (HTTP and gRPC).

    pygraphx-driver serve --model-repository models/            # one sub-folder per model
    pygraphx-driver serve --onnx resnet50.onnx --cpu --max-batch 8
    pygraphx-driver serve --migraphx resnet50.pgx --http-port 8000 --grpc-port 8001

Settings given here override every model's config.json (see `pygraphx/serve/config.py`).
SIGINT or SIGTERM stops it gracefully: requests in flight finish first.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import Any

from pygraphx.driver.commands import Steps
from pygraphx.driver.loader import DriverError

#: option -> config setting it overrides
_OVERRIDES = {
    "target": "target",
    "precision": "precision",
    "max_batch": "max_batch",
    "batch_window_us": "batch_window_us",
    "instances": "instances",
    "queue_size": "queue_size",
    "timeout": "timeout_s",
}


def serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `serve`: what to serve, where, and how."""
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model-repository", metavar="DIR", help="a folder of model folders")
    what.add_argument("--onnx", metavar="FILE", help="one ONNX model, named after its stem")
    what.add_argument("--migraphx", metavar="FILE", help="one saved program (.pgx)")
    net = parser.add_argument_group("network")
    net.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: all)")
    net.add_argument("--http-port", type=int, default=8000, help="HTTP/REST port (8000)")
    net.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (8001)")
    net.add_argument("--max-request-bytes", type=int, default=64 << 20, help="request size limit")
    net.add_argument("--grace", type=float, default=30.0, help="shutdown grace period in s")
    net.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    model = parser.add_argument_group("model settings (override config.json)")
    target = model.add_mutually_exclusive_group()
    for name in ("ref", "cpu", "gpu"):
        target.add_argument(f"--{name}", dest="target", action="store_const", const=name)
    model.add_argument("--precision", choices=["fp32", "fp16", "bf16"])
    model.add_argument("--max-batch", type=int, help="largest dynamic batch (0: no batching)")
    model.add_argument("--batch-window-us", type=int, help="how long a batch waits to fill")
    model.add_argument("--no-batching", action="store_true", help="run each request alone")
    model.add_argument("--instances", type=int, help="programs running concurrently")
    model.add_argument("--queue-size", type=int, help="waiting requests before 429")
    model.add_argument("--timeout", type=float, help="seconds a request may wait")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out = {key: getattr(args, opt) for opt, key in _OVERRIDES.items()}
    out = {k: v for k, v in out.items() if v is not None}
    if args.no_batching:
        out["dynamic_batching"] = False
    return out


def cmd_serve(args: argparse.Namespace, steps: Steps) -> int:
    """Load every model, then serve until SIGINT/SIGTERM."""
    from pygraphx.serve import config, logs
    from pygraphx.serve.core import InferenceServer
    from pygraphx.serve.server import serve

    logs.configure(args.log_level)
    overrides = _overrides(args)
    try:
        if args.model_repository is not None:
            sources = config.scan_repository(Path(args.model_repository), overrides)
        else:
            sources = [config.single_model(Path(args.onnx or args.migraphx), overrides)]
    except config.ConfigError as exc:
        raise DriverError(str(exc)) from exc
    with steps(f"load {len(sources)} model(s)"):
        try:
            server = InferenceServer.load(sources)
        except config.ConfigError as exc:
            raise DriverError(str(exc)) from exc

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(
            server,
            stop,
            host=args.host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            grace_s=args.grace,
            max_body_bytes=args.max_request_bytes,
            on_ready=lambda p: print(f"Serving: HTTP {p.http}, gRPC {p.grpc}", flush=True),
        )

    asyncio.run(main())
    return 0
