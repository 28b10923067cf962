"""Dynamic batching: a bounded queue per model, gathered into batches that run on a thread.

`submit` checks one request's inputs (a bad request fails alone, before it is queued), refuses
it when the queue is full (`QueueFullError`: HTTP 429, gRPC RESOURCE_EXHAUSTED) or the server
is shutting down, and waits at most the model's `timeout_s` for its result. Each of the
model's instances has a worker task: it takes the oldest request, then keeps taking requests
while their rows fit in `max_batch` and the first one has waited less than `batch_window_us`,
concatenates their inputs along the batch axis, runs them as one batch in a thread, and splits
the outputs back. When a batch fails, its requests run one by one, so an error reaches only the
request that causes it. `close` stops taking requests and returns when the queued ones are done.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from pygraphx.serve.metrics import Metrics
from pygraphx.serve.model import ServedModel

log = logging.getLogger("pygraphx.serve")


class QueueFullError(RuntimeError):
    """The model's queue holds `queue_size` requests already."""


class ShuttingDownError(RuntimeError):
    """The server is draining and takes no new requests."""


@dataclass
class _Pending:
    inputs: dict[str, np.ndarray]
    rows: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)


class Batcher:
    """Queue and workers of one model."""

    def __init__(self, model: ServedModel, metrics: Metrics) -> None:
        self.model = model
        self.metrics = metrics
        cfg = model.config
        self.batching = cfg.dynamic_batching and model.max_batch > 0
        self.window = cfg.batch_window_us / 1e6
        self.queue: deque[_Pending] = deque()
        self.closed = False
        self._event = asyncio.Event()
        self._pool = ThreadPoolExecutor(cfg.instances, thread_name_prefix=f"pgx-{model.name}")
        self._workers = [asyncio.create_task(self._worker(k)) for k in range(cfg.instances)]

    async def submit(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs of one request (all of the model's outputs)."""
        rows = self.model.check(inputs)
        if self.closed:
            raise ShuttingDownError(f"model {self.model.name!r}: the server is shutting down")
        if len(self.queue) >= self.model.config.queue_size:
            raise QueueFullError(
                f"model {self.model.name!r}: queue full ({self.model.config.queue_size} "
                "requests waiting); retry later"
            )
        pending = _Pending(inputs, rows, asyncio.get_running_loop().create_future())
        self.queue.append(pending)
        self._depth()
        self._event.set()
        try:
            return await asyncio.wait_for(pending.future, self.model.config.timeout_s)
        finally:
            self.metrics.latency.labels(self.model.name).observe(
                time.perf_counter() - pending.arrived
            )

    async def close(self) -> None:
        """Take no more requests; return when every queued one has run."""
        self.closed = True
        self._event.set()
        await asyncio.gather(*self._workers)
        self._pool.shutdown(wait=True)

    def _depth(self) -> None:
        self.metrics.queue_depth.labels(self.model.name).set(len(self.queue))

    async def _worker(self, instance: int) -> None:
        while True:
            batch = await self._gather()
            if batch is None:
                return
            self._depth()
            await self._run(batch, instance)

    async def _next(self) -> _Pending | None:
        """The oldest request still waiting (timed-out ones are dropped); None when closed."""
        while True:
            while self.queue:
                item = self.queue.popleft()
                if not item.future.done():
                    return item
            if self.closed:
                return None
            self._event.clear()
            await self._event.wait()

    async def _gather(self) -> list[_Pending] | None:
        first = await self._next()
        if first is None:
            return None
        batch, rows = [first], first.rows
        if not self.batching:
            return batch
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.window
        while rows < self.model.max_batch:
            if self.queue:
                nxt = self.queue[0]
                if nxt.future.done():
                    self.queue.popleft()
                    continue
                if rows + nxt.rows > self.model.max_batch:
                    break
                batch.append(self.queue.popleft())
                rows += nxt.rows
                continue
            remaining = deadline - loop.time()
            if remaining <= 0 or self.closed:
                break
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), remaining)
            except TimeoutError:
                break
        return batch

    async def _run(self, batch: list[_Pending], instance: int) -> None:
        loop = asyncio.get_running_loop()
        names = list(batch[0].inputs)
        joined = (
            batch[0].inputs
            if len(batch) == 1
            else {n: np.concatenate([p.inputs[n] for p in batch]) for n in names}
        )
        start = time.perf_counter()
        try:
            outputs = await loop.run_in_executor(self._pool, self.model.run, joined, instance)
        except Exception as exc:  # noqa: BLE001 - isolated below, each request gets its own answer
            if len(batch) == 1:
                _answer(batch[0], exc=exc)
                return
            log.warning(
                "model %s: a batch of %d failed (%s); running them one by one",
                self.model.name,
                len(batch),
                exc,
            )
            for p in batch:
                await self._run([p], instance)
            return
        name = self.model.name
        self.metrics.compute.labels(name).observe(time.perf_counter() - start)
        self.metrics.batch_size.labels(name).observe(sum(p.rows for p in batch))
        if not self.model.max_batch:  # unbatched: the only request gets the whole outputs
            _answer(batch[0], outputs)
            return
        offset = 0
        for p in batch:
            _answer(p, {k: v[offset : offset + p.rows] for k, v in outputs.items()})
            offset += p.rows


def _answer(p: _Pending, result: dict | None = None, exc: BaseException | None = None) -> None:
    if p.future.done():  # timed out or cancelled meanwhile
        return
    if exc is not None:
        p.future.set_exception(exc)
    else:
        p.future.set_result(result)
