"""The transport-independent server: loaded models, their batchers, readiness and metadata.

The HTTP (`http_app.py`) and gRPC (`grpc_server.py`) front ends translate the KServe v2
protocol to calls on one `InferenceServer`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np

from pygraphx.serve.batcher import Batcher
from pygraphx.serve.config import ModelSource
from pygraphx.serve.metrics import Metrics
from pygraphx.serve.model import RequestError, ServedModel
from pygraphx.version import __version__

log = logging.getLogger("pygraphx.serve")

SERVER_NAME = "pygraphx"
EXTENSIONS = ["binary_tensor_data"]


class ModelNotFoundError(LookupError):
    """No model of that name (and version) is served."""


class InferenceServer:
    """Models by name; `start` (inside the event loop) makes their batchers."""

    def __init__(self, models: Iterable[ServedModel]) -> None:
        self.models = {m.name: m for m in models}
        self.metrics = Metrics()
        self.batchers: dict[str, Batcher] = {}
        self.live = True
        self.draining = False  # shutting down: not ready, requests in flight finish
        self.in_flight = 0  # infer calls begun and not yet answered

    @classmethod
    def load(cls, sources: Iterable[ModelSource]) -> InferenceServer:
        """Load (compile, or read from the cache) every model."""
        models = []
        for src in sources:
            log.info("loading model %s from %s (%s)", src.name, src.path, src.config)
            models.append(ServedModel(src))
        return cls(models)

    def start(self) -> None:
        """Create the batchers; call from the running event loop."""
        self.batchers = {name: Batcher(m, self.metrics) for name, m in self.models.items()}

    async def stop(self) -> None:
        """Refuse new requests and finish the queued ones (after the front ends have stopped
        taking requests and answered those they had)."""
        for b in self.batchers.values():
            b.closed = True
        for b in self.batchers.values():
            await b.close()

    def ready(self) -> bool:
        return bool(self.batchers) and not self.draining

    def model(self, name: str, version: str = "") -> ServedModel:
        m = self.models.get(name)
        if m is None or (version and version != m.config.version):
            what = f"{name!r} version {version!r}" if version else repr(name)
            raise ModelNotFoundError(f"model {what} is not served (served: {sorted(self.models)})")
        return m

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self.model(name, version)
        except ModelNotFoundError:
            return False
        return name in self.batchers and not self.draining

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        m = self.model(name, version)
        tensors = lambda specs: [  # noqa: E731
            {"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs
        ]
        return {
            "name": m.name,
            "versions": [m.config.version],
            "platform": f"pygraphx_{m.target}",
            "inputs": tensors(m.inputs),
            "outputs": tensors(m.outputs),
        }

    async def infer(
        self, name: str, version: str, inputs: dict[str, np.ndarray], wanted: list[str]
    ) -> dict[str, np.ndarray]:
        """The outputs named in `wanted` (all when empty) of one request."""
        m = self.model(name, version)
        unknown = sorted(set(wanted) - {s.name for s in m.outputs})
        if unknown:
            raise RequestError(
                f"model {name!r} has no output(s) {unknown}; outputs: {[s.name for s in m.outputs]}"
            )
        batcher = self.batchers.get(name)
        if batcher is None:
            raise ModelNotFoundError(f"model {name!r} is not ready")
        self.in_flight += 1
        try:
            outputs = await batcher.submit(inputs)
        finally:
            self.in_flight -= 1
        return {k: outputs[k] for k in wanted} if wanted else outputs
