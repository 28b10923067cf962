"""Running the server: HTTP (uvicorn) and gRPC (grpc.aio) on one event loop, and stopping it.

`serve` runs until its stop event is set (the driver sets it on SIGINT/SIGTERM); then it stops
being ready, closes the listeners, lets uvicorn and gRPC answer the requests they have taken (at
most `grace_s`; the batchers keep running for them), and then closes the batchers.
`ServerThread` runs the same in a background thread (the tests, the benchmark).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import uvicorn

from pygraphx.serve.core import InferenceServer
from pygraphx.serve.grpc_server import create_server
from pygraphx.serve.http_app import create_app

log = logging.getLogger("pygraphx.serve")


@dataclass
class Ports:
    """The ports the server listens on (useful when 0 asked for any free one)."""

    http: int
    grpc: int


class _Uvicorn(uvicorn.Server):
    """uvicorn's server without its own signal handling: `serve` decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it responses written in two parts wait ~40 ms for the peer's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


async def serve(
    server: InferenceServer,
    stop: asyncio.Event,
    host: str = "127.0.0.1",
    http_port: int = 8000,
    grpc_port: int = 8001,
    grace_s: float = 30.0,
    max_body_bytes: int = 64 << 20,
    on_ready: Callable[[Ports], None] | None = None,
) -> None:
    """Serve `server` over HTTP and gRPC until `stop` is set, then shut down gracefully."""
    server.start()
    grpc_server = create_server(server, host, grpc_port, max_body_bytes)
    await grpc_server.start()
    sock = _listen(host, http_port)
    config = uvicorn.Config(
        create_app(server, max_body_bytes),
        lifespan="off",
        log_level="warning",
        timeout_graceful_shutdown=int(grace_s),
        backlog=2048,
    )
    http = _Uvicorn(config)
    http_task = asyncio.create_task(http.serve(sockets=[sock]))
    while not http.started and not http_task.done():
        await asyncio.sleep(0.01)
    if http_task.done():  # failed to start: its exception
        await grpc_server.stop(None)
        http_task.result()
    ports = Ports(sock.getsockname()[1], grpc_server.bound_port)
    log.info(
        "serving %s: HTTP on %s:%d, gRPC on %s:%d",
        sorted(server.models),
        host,
        ports.http,
        host,
        ports.grpc,
    )
    if on_ready is not None:
        on_ready(ports)
    await stop.wait()
    log.info("shutting down: finishing the requests in flight")
    server.draining = True
    http.should_exit = True  # stop listening, answer the requests already taken
    await asyncio.gather(grpc_server.stop(grace_s), http_task)
    await server.stop()  # nothing new can arrive: drain what is queued
    server.live = False
    log.info("stopped")


class ServerThread:
    """`serve` on its own event loop in a background thread; `start` returns once it listens."""

    def __init__(self, server: InferenceServer, **options) -> None:
        self.server = server
        self.options = options
        self.ports: Ports | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="pgx-serve", daemon=True)

    def start(self, timeout: float = 60.0) -> Ports:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the server did not start in {timeout} s")
        if self._error is not None:
            raise RuntimeError(f"the server failed to start: {self._error}") from self._error
        return self.ports

    def stop(self, timeout: float = 60.0) -> None:
        """Graceful shutdown (in-flight requests finish); returns when the thread has ended."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await serve(self.server, self._stop, on_ready=self._on_ready, **self.options)

        try:
            asyncio.run(run())
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            self._error = exc
            self._ready.set()
            if self.ports is not None:
                log.exception("the server thread failed")

    def _on_ready(self, ports: Ports) -> None:
        self.ports = ports
        self._ready.set()
