"""Scale-out on Ray: a Ray Serve deployment of a served model, and Ray Data batch inference.

    from pygraphx.serve.ray import deployment, map_batches
    app = deployment("bert/model.onnx", config={"max_batch": 8},
                     autoscaling_config={"min_replicas": 1, "max_replicas": 4})
    handle = ray.serve.run(app, route_prefix="/bert")
    outputs = handle.infer.remote({"input_ids": ids, ...}).result()

    predictions = map_batches(ray.data.from_numpy(...), "resnet50.onnx", concurrency=2)

Each replica is a `Replica`: the same `InferenceServer` and dynamic batcher as
`pygraphx-driver serve`, for one model, so requests routed to one replica are batched there.
Replicas load the compiled programs cached next to the model file (the first one to start
compiles them). Over Ray Serve's HTTP proxy a replica answers the KServe v2 infer body (JSON or
binary tensors) at its route. `map_batches` runs the model over a dataset whose columns are the
model's inputs, in batches of at most `max_batch` rows, and adds the outputs as columns.
Needs `pip install 'pygraphx[ray]'`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from ray import serve

from pygraphx.serve.config import read_config, single_model
from pygraphx.serve.core import InferenceServer
from pygraphx.serve.model import ServedModel
from pygraphx.serve.protocol import HEADER_LENGTH, decode_http, encode_http


class Replica:
    """One model served inside a Ray Serve replica (the deployment's class)."""

    def __init__(self, path: str, config: dict[str, Any] | None = None) -> None:
        source = single_model(Path(path), config)
        self.name = source.name
        self.server = InferenceServer.load([source])
        self._started = False

    def _start(self) -> None:
        if not self._started:  # the batcher lives on the replica's event loop
            self.server.start()
            self._started = True

    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """All outputs of one request (arrays with a leading batch axis)."""
        self._start()
        return await self.server.infer(self.name, "", dict(inputs), [])

    def metadata(self) -> dict[str, Any]:
        """KServe v2 model metadata, plus the replica's process id (`pid`)."""
        return {**self.server.model_metadata(self.name), "pid": os.getpid()}

    async def __call__(self, request: Any) -> Any:
        """A KServe v2 infer body over Ray Serve's HTTP proxy (a Starlette request)."""
        from starlette.responses import JSONResponse, Response

        body = await request.body()
        length = request.headers.get(HEADER_LENGTH)
        try:
            req = decode_http(body, int(length) if length and length.isdigit() else None)
            outputs = await self.infer(req.inputs)
        except ValueError as exc:  # ProtocolError, RequestError
            return JSONResponse({"error": str(exc)}, status_code=400)
        wanted = {k: outputs[k] for k in req.outputs} if req.outputs else outputs
        version = self.server.models[self.name].config.version
        data, header_length = encode_http(self.name, version, req, wanted)
        if header_length is None:
            return Response(data, media_type="application/json")
        return Response(data, headers={HEADER_LENGTH: str(header_length)})


def deployment(
    path: str | Path,
    *,
    config: dict[str, Any] | None = None,
    name: str | None = None,
    num_replicas: int | None = None,
    autoscaling_config: dict[str, Any] | None = None,
    ray_actor_options: dict[str, Any] | None = None,
    max_ongoing_requests: int | None = None,
) -> serve.Application:
    """A Ray Serve application serving the model file at `path` (settings as config.json's).

    Give `num_replicas` or `autoscaling_config` (Ray Serve's: min/max replicas, target ongoing
    requests per replica, ...), not both."""
    if num_replicas is not None and autoscaling_config is not None:
        raise ValueError("give num_replicas or autoscaling_config, not both")
    options: dict[str, Any] = {"name": name or Path(path).stem}
    for key, value in (
        ("num_replicas", num_replicas),
        ("autoscaling_config", autoscaling_config),
        ("ray_actor_options", ray_actor_options),
        ("max_ongoing_requests", max_ongoing_requests),
    ):
        if value is not None:
            options[key] = value
    return serve.deployment(Replica, **options).bind(str(path), config)


class BatchPredictor:
    """Ray Data's callable class for `map_batches`: the model once per worker, run on column
    batches of at most `max_batch` rows."""

    def __init__(self, path: str, config: dict[str, Any] | None = None) -> None:
        self.model = ServedModel(single_model(Path(path), config))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [s.name for s in self.model.inputs]
        rows = len(batch[names[0]])
        step = self.model.max_batch or rows
        parts = []
        for start in range(0, rows, step):
            inputs = {n: np.ascontiguousarray(batch[n][start : start + step]) for n in names}
            self.model.check(inputs)
            parts.append(self.model.run(inputs))
        outputs = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return {**batch, **outputs}


def map_batches(
    dataset: Any,
    path: str | Path,
    *,
    config: dict[str, Any] | None = None,
    batch_size: int | None = None,
    concurrency: int = 1,
    **options: Any,
) -> Any:
    """`dataset.map_batches` running the model at `path`; the outputs become columns."""
    max_batch = read_config(Path(path).parent, config).max_batch
    return dataset.map_batches(
        BatchPredictor,
        fn_constructor_args=(str(path), config),
        batch_size=batch_size or max_batch or None,
        batch_format="numpy",
        concurrency=concurrency,
        **options,
    )
