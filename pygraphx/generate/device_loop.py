"""Decoding with the KV cache kept on the device (the `gpu` target): no host round trip per token.

`DeviceCache` holds the cache as preallocated torch tensors on the program's device, one per
layer and key/value, [batch, kv_heads, capacity, head_dim], and the mask of valid slots
[batch, capacity]. A step runs the program compiled for its (batch, seq, past bucket) shape
(`DecoderSession.device_executable`: one specialization per shape, captured once as a CUDA
graph and replayed after): the past inputs are views of the cache (the replay copies them into
the graph's static buffers on the device), the new keys/values are copied from the present
outputs into the cache slots after the valid ones in place (one multi-tensor copy), and
input_ids, position ids and the mask never leave the device.

`run_device_generation` is `loop.run_generation` on the device: greedy tokens are chosen on the
device (argmax). With no stop tokens nothing is read back until the end, so the host queues
steps ahead of the device; with stop tokens each step reads the new token ids (one small copy);
sampling reads the last logits and samples them on the host (`sampling.next_tokens`, the same
draws as the host loop).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pygraphx.generate.sampling import SamplingConfig, next_tokens
from pygraphx.generate.session import GenerateError, bucket

if TYPE_CHECKING:
    from pygraphx.generate.session import DecoderSession

_NUMPY_TO_TORCH = {
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float64): torch.float64,
}


class DeviceCache:
    """The KV cache of one batch on `device` (see the module docstring)."""

    def __init__(
        self, session: DecoderSession, batch: int, capacity: int, device: torch.device
    ) -> None:
        lay = session.layout
        if lay.dtype not in _NUMPY_TO_TORCH:
            raise GenerateError(f"KV cache of type {lay.dtype} is not supported on the device")
        shape = (batch, lay.kv_heads, capacity, lay.head_dim)
        dtype = _NUMPY_TO_TORCH[lay.dtype]
        self.session = session
        self.device = device
        self.tensors = [torch.zeros(shape, dtype=dtype, device=device) for _ in lay.past_names]
        self.valid = torch.zeros((batch, capacity), dtype=torch.int64, device=device)

    @property
    def capacity(self) -> int:
        return self.valid.shape[1]

    def step(
        self, length: int, ids: torch.Tensor, new_mask: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Run `ids` [batch, seq] (on the device) after `length` cached slots; the last
        position's logits [batch, vocab], on the device."""
        batch, seq = ids.shape
        past = bucket(length)
        session = self.session
        if past > session.layout.max_past:
            raise GenerateError(
                f"context of {length + seq} tokens needs a past of {past}, more than the "
                f"{session.layout.max_past} the decoder was opened for (max_context)"
            )
        if length + seq > self.capacity or past > self.capacity:
            raise GenerateError(f"context {length + seq} exceeds the cache ({self.capacity})")
        exe, names = session.device_executable(batch, seq, past)
        feed = {
            "input_ids": ids,
            "attention_mask": torch.cat((self.valid[:, :past], new_mask), dim=1),
        }
        if session.has_positions:
            feed["position_ids"] = positions
        lay = session.layout
        for name, buf in zip(lay.past_names, self.tensors, strict=True):
            feed[name] = buf[:, :, :past]
        outs = exe._execute(feed, None)  # device tensors in, the graph's outputs back
        by_name = dict(zip(names, outs, strict=True))
        news = [by_name[n][:, :, past : past + seq] for n in lay.present_names]
        slots = [buf[:, :, length : length + seq] for buf in self.tensors]
        torch._foreach_copy_(slots, news)
        self.valid[:, length : length + seq] = new_mask
        logits = by_name.get("logits", outs[0])
        return logits[:, -1, :]


def run_device_generation(
    session: DecoderSession,
    ids: np.ndarray,
    mask: np.ndarray,
    max_new_tokens: int,
    sampling: SamplingConfig,
    stops: set[int],
    pad_id: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, float, float]:
    """`loop.run_generation` after left-padding, with the cache on the session's device:
    (new tokens [batch, n], prefill seconds (time to first token), decode seconds)."""
    device = session.device
    batch, width = ids.shape
    with torch.inference_mode():
        cache = DeviceCache(session, batch, bucket(width + max_new_tokens), device)
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        positions = np.where(mask == 0, 1, positions)
        pos = torch.from_numpy(positions[:, -1:] + 1).to(device)
        out = torch.full((batch, max_new_tokens), pad_id, dtype=torch.int64, device=device)
        ones = torch.ones((batch, 1), dtype=torch.int64, device=device)
        _sync(device)
        start = time.perf_counter()
        logits = cache.step(0, _dev(ids, device), _dev(mask, device), _dev(positions, device))
        state = _Stops(stops, batch, pad_id, device)
        n, length, prefill_s = max_new_tokens, width, 0.0
        for t in range(max_new_tokens):
            tok = _choose(logits, sampling, rng)
            tok = state.apply(tok)
            out[:, t] = tok
            if t == 0:
                _sync(device)
                prefill_s = time.perf_counter() - start
                start = time.perf_counter()
            if state.all_done() or t == max_new_tokens - 1:
                n = t + 1
                break
            logits = cache.step(length, tok[:, None], ones, pos)
            length += 1
            pos += 1
        tokens = out[:, :n].cpu().numpy()  # waits for the device
        decode_s = time.perf_counter() - start
    return tokens, prefill_s, decode_s


class _Stops:
    """Rows that emitted a stop token get `pad_id` after it; checked on the host (one small
    copy per step) only when there are stop tokens."""

    def __init__(self, stops: set[int], batch: int, pad_id: int, device: torch.device) -> None:
        self.stops = stops
        self.ids = torch.tensor(sorted(stops), dtype=torch.int64, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.pad = pad_id

    def apply(self, tok: torch.Tensor) -> torch.Tensor:
        if not self.stops:
            return tok
        tok = torch.where(self.done, torch.full_like(tok, self.pad), tok)
        self.done |= torch.isin(tok, self.ids)
        return tok

    def all_done(self) -> bool:
        return bool(self.stops) and bool(self.done.all().item())


def _choose(logits: torch.Tensor, sampling: SamplingConfig, rng: np.random.Generator) -> Any:
    """Next token ids [batch] on the logits' device: argmax there, or sampled on the host."""
    if not sampling.do_sample:
        return logits.argmax(dim=-1)
    host = logits.float().cpu().numpy()
    return torch.from_numpy(next_tokens(host, sampling, rng)).to(logits.device)


def _dev(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
