"""Decoding with the KV cache on the device (the `gpu` target): one graph replay per token.

Each decode step runs the program compiled for its (batch, 1, past bucket P) shape
(`DecoderSession.device_executable`, captured once as a CUDA graph). Its static input buffers
ARE the cache while the context stays in that bucket: `past_key_values.*` [batch, kv_heads, P,
head_dim], `attention_mask` [batch, P + 1], `input_ids` and `position_ids` [batch, 1]. After
the program, a second small captured graph, the *epilogue*, does everything else a token needs
on the device: it chooses the token (argmax; or takes the one the host sampled), masks rows
that stopped (pad after a stop token), records it in a token buffer, writes the step's new
keys/values (`present.*[:, :, P]`) into their cache slot and marks the slot valid in the mask,
feeds the token back as the next `input_ids`, and advances the position and length counters
(device scalars). So a greedy token costs two graph launches and nothing else on the host:
no copy, no read back. With stop tokens the host reads whether every row stopped once per
`STOP_CHECK_EVERY` tokens; the tokens after the stop are cut exactly as the host loop cuts them.
Sampling reads the last logits and samples them on the host (`sampling.next_tokens`, the same
draws as the host loop) and writes the token before the epilogue.

Moving to the next bucket (the context passes P, a handful of times per generation) and
prefill are the only steps that run the program through `_execute` with freshly built inputs
(which copies them into the graph's buffers). The epilogue of the step that fills a bucket
writes its slot at P - 1 (clamped, never out of range); the next bucket is built from that
step's present outputs, which hold every slot.

Without CUDA graphs (the gpu target on the CPU, `PGX_GPU_GRAPH=0`, a program that cannot be
captured) the same buffers and the same epilogue run eagerly: one `_execute` and one epilogue
call per token, which is what the tests count on the CPU.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pygraphx.generate.sampling import SamplingConfig, next_tokens
from pygraphx.generate.session import GenerateError, bucket, past_bucket

if TYPE_CHECKING:
    from pygraphx.generate.session import DecoderSession

#: with stop tokens, the host reads whether every row stopped once per this many tokens
STOP_CHECK_EVERY = 8

_NUMPY_TO_TORCH = {
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float64): torch.float64,
}


def marked(name: str) -> Any:
    """A profiler range named `name` while the torch profiler runs (tests count the host work
    of a token with it), else nothing (no cost on the hot path)."""
    if torch.autograd.profiler._is_profiler_enabled:
        return torch.autograd.profiler.record_function(name)
    return contextlib.nullcontext()


@dataclass
class DecodeState:
    """Device tensors shared by one batch's decode steps and epilogues (their addresses are
    baked into the captured epilogues, so they live as long as the session)."""

    length: torch.Tensor  # [1] int64: cache slots filled
    step: torch.Tensor  # [1] int64: tokens chosen
    tokens: torch.Tensor  # [batch, capacity] int64: the chosen tokens
    done: torch.Tensor  # [batch] bool: rows that emitted a stop token
    stop_ids: torch.Tensor  # [n] int64 (n >= 1; unused without stops)
    pad: torch.Tensor  # [] int64
    chosen: torch.Tensor  # [batch] int64: the token the host sampled
    has_stops: bool
    sampled: bool
    epilogues: dict[int, Any] = field(default_factory=dict)  # past bucket -> captured graph

    @classmethod
    def new(
        cls, batch: int, capacity: int, n_stops: int, sampled: bool, device: torch.device
    ) -> DecodeState:
        def i64(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int64, device=device)

        done = torch.zeros(batch, dtype=torch.bool, device=device)
        return cls(
            i64(1), i64(1), i64(batch, capacity), done, i64(max(n_stops, 1)), i64(),
            i64(batch), n_stops > 0, sampled,
        )  # fmt: skip

    def reset(self, stops: set[int], pad_id: int) -> None:
        """Start a generation: counters zero, no row stopped, these stop ids and pad."""
        self.length.zero_()
        self.step.zero_()
        self.done.zero_()
        self.pad.fill_(pad_id)
        if stops:
            ids = sorted(stops)
            ids += [ids[0]] * (self.stop_ids.numel() - len(ids))
            self.stop_ids.copy_(torch.tensor(ids, dtype=torch.int64))

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """The next tokens [batch] from the last logits [batch, vocab] (or the sampled ones),
        rows that stopped given the pad id; recorded at `step` (which advances)."""
        tok = self.chosen if self.sampled else logits.argmax(dim=-1)
        if self.has_stops:
            tok = torch.where(self.done, self.pad, tok)
            # not torch.isin: for larger inputs it sorts and may read sizes on the host
            self.done |= (tok[:, None] == self.stop_ids[None, :]).any(dim=1)
        self.tokens.index_copy_(1, self.step, tok[:, None])
        self.step += 1
        return tok


@dataclass
class Bucket:
    """The decode program for one past bucket and the tensors its steps use."""

    past: int
    exe: Any
    names: list[str]
    inputs: dict[str, torch.Tensor]  # the cache and the step's inputs (the graph's own buffers)
    outputs: list[torch.Tensor]  # the graph's outputs (rewritten by each replay)

    @property
    def captured(self) -> bool:
        return self.exe.graph is not None

    def output(self, name: str) -> torch.Tensor:
        return self.outputs[self.names.index(name)]


def epilogue(state: DecodeState, b: Bucket, present_names: list[str]) -> None:
    """After a decode step at `state.length`: choose its token and write the step's keys,
    values and mask bit into slot `length` (clamped to P - 1 when the bucket is full; the
    next bucket is then built from the present outputs), feed the token back, advance."""
    p = b.past
    tok = state.choose(last_logits(b.names, b.outputs))
    slot = state.length.clamp(max=p - 1)
    for name, present in zip(present_names, _presents(b, present_names), strict=True):
        b.inputs[_past_name(name)].index_copy_(2, slot, present[:, :, p : p + 1])
    b.inputs["attention_mask"].index_fill_(1, slot, 1)
    b.inputs["input_ids"].copy_(tok[:, None])
    if "position_ids" in b.inputs:
        b.inputs["position_ids"] += 1
    state.length += 1


def _presents(b: Bucket, present_names: list[str]) -> list[torch.Tensor]:
    return [b.output(n) for n in present_names]


def _past_name(present: str) -> str:
    return present.replace("present", "past_key_values", 1)


def _captured_epilogue(state: DecodeState, b: Bucket, present_names: list[str]) -> Any:
    """The epilogue of bucket `b` captured as a CUDA graph, after one warm-up on copies of
    everything it writes (the warm-up must not move the real counters)."""
    scratch_state = DecodeState(
        *(t.clone() for t in (state.length, state.step, state.tokens, state.done)),
        state.stop_ids, state.pad, state.chosen, state.has_stops, state.sampled,
    )  # fmt: skip
    scratch = Bucket(b.past, b.exe, b.names, {k: v.clone() for k, v in b.inputs.items()}, b.outputs)
    stream = torch.cuda.Stream(b.outputs[0].device)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        epilogue(scratch_state, scratch, present_names)
    torch.cuda.current_stream().wait_stream(stream)
    del scratch, scratch_state
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        epilogue(state, b, present_names)
    return graph


Sampler = Callable[[torch.Tensor], torch.Tensor]


class DeviceDecoder:
    """One generation's decode steps on the device (see the module docstring). `sampler`
    (sampling only) maps the last logits [batch, vocab] to the next tokens [batch]."""

    def __init__(
        self, session: DecoderSession, state: DecodeState, sampler: Sampler | None = None
    ) -> None:
        self.session = session
        self.state = state
        self.sampler = sampler
        self.present_names = session.layout.present_names
        self.bucket: Bucket | None = None
        self.replays = 0  # steps that ran as replays of captured graphs
        self.entries = 0  # steps that entered a bucket (inputs built and copied)

    def enter(
        self,
        length: int,
        past: list[torch.Tensor],
        mask: torch.Tensor,
        ids: torch.Tensor,
        positions: torch.Tensor | None,
    ) -> None:
        """Run the decode step at `length` in its bucket, the cache taken from `past` [batch,
        kv_heads, n, head_dim] and `mask` [batch, n] (slots 0..n-1); then its epilogue."""
        p = past_bucket(length, self.session.layout.max_past)
        lay = self.session.layout
        if p > lay.max_past:
            raise GenerateError(
                f"context of {length + 1} tokens needs a past of {p}, more than the "
                f"{lay.max_past} the decoder was opened for (max_context)"
            )
        batch, n = mask.shape
        exe, names = self.session.device_executable(batch, 1, p)
        with marked("pgx::decode_enter"):
            feed = {"input_ids": ids.clone(), "attention_mask": mask.new_zeros((batch, p + 1))}
            feed["attention_mask"][:, :n] = mask
            feed["attention_mask"][:, p] = 1
            if self.session.has_positions and positions is not None:
                feed["position_ids"] = positions.clone()
            for name, src in zip(lay.past_names, past, strict=True):
                buf = src.new_zeros((batch, lay.kv_heads, p, lay.head_dim))
                buf[:, :, :n] = src
                feed[name] = buf
            outs = exe._execute(feed, None)
            self.entries += 1
            if exe.graph is not None:
                self.bucket = Bucket(p, exe, names, exe.static, exe.graph_outputs)
            else:
                self.bucket = Bucket(p, exe, names, feed, list(outs))
        self._epilogue()

    def step(self) -> None:
        """The next decode step in the current bucket: the program, then its epilogue."""
        b = self.bucket
        assert b is not None
        with marked("pgx::decode_main"):
            if b.captured:
                b.exe.graph.replay()
                self.replays += 1
            else:
                b.outputs = list(b.exe._execute(b.inputs, None))
        self._epilogue()

    def _epilogue(self) -> None:
        b, state = self.bucket, self.state
        assert b is not None
        if self.sampler is not None:
            with marked("pgx::sample"):
                state.chosen.copy_(self.sampler(last_logits(b.names, b.outputs)))
        with marked("pgx::decode_epilogue"):
            if not b.captured:
                epilogue(state, b, self.present_names)
                return
            graph = state.epilogues.get(b.past)
            if graph is None:
                graph = _captured_epilogue(state, b, self.present_names)
                state.epilogues[b.past] = graph
            graph.replay()

    def handoff(self) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, Any]:
        """The sources of the next bucket after the step that filled this one: every slot of
        the present outputs, the mask, the fed-back token and position."""
        b = self.bucket
        assert b is not None
        inputs = b.inputs
        presents = _presents(b, self.present_names)
        return presents, inputs["attention_mask"], inputs["input_ids"], inputs.get("position_ids")


def last_logits(names: list[str], outputs: list[torch.Tensor]) -> torch.Tensor:
    """The last position's logits [batch, vocab] of a step's outputs."""
    logits = outputs[names.index("logits")] if "logits" in names else outputs[0]
    return logits[:, -1, :]


def decode_state(
    session: DecoderSession, batch: int, max_new_tokens: int, n_stops: int, sampled: bool
) -> DecodeState:
    """The session's decode state for this kind of generation (made once: the captured
    epilogues point at its tensors)."""
    key = (batch, bucket(max_new_tokens), bucket(n_stops, 4) if n_stops else 0, sampled)
    state = session.device_states.get(key)
    if state is None:
        state = DecodeState.new(batch, key[1], key[2], sampled, session.device)
        session.device_states[key] = state
    return state


def _prefill(
    session: DecoderSession,
    state: DecodeState,
    sampler: Sampler | None,
    feed: dict[str, torch.Tensor],
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, Any]:
    """The prompt's step (past: an empty bucket), its token chosen; the next bucket's sources."""
    ids, mask = feed["input_ids"], feed["attention_mask"]
    (batch, width), p, lay = ids.shape, bucket(0), session.layout
    exe, names = session.device_executable(batch, width, p)
    shape = (batch, lay.kv_heads, p, lay.head_dim)
    zeros = torch.zeros(shape, dtype=_kv_dtype(session), device=ids.device)
    full = dict(feed, attention_mask=torch.cat((mask.new_zeros((batch, p)), mask), dim=1))
    full.update({n: zeros for n in lay.past_names})
    if not session.has_positions:
        full.pop("position_ids")
    with marked("pgx::prefill"):
        outs = exe._execute(full, None)
        logits = last_logits(names, list(outs))
        if sampler is not None:
            state.chosen.copy_(sampler(logits))
        tok = state.choose(logits)
        state.length.fill_(width)
    by_name = dict(zip(names, outs, strict=True))
    presents = [by_name[n][:, :, p : p + width] for n in lay.present_names]
    return presents, mask, tok[:, None], feed["position_ids"][:, -1:] + 1


def _kv_dtype(session: DecoderSession) -> torch.dtype:
    dtype = session.layout.dtype
    if dtype not in _NUMPY_TO_TORCH:
        raise GenerateError(f"KV cache of type {dtype} is not supported on the device")
    return _NUMPY_TO_TORCH[dtype]


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
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    positions = np.where(mask == 0, 1, positions)
    sampler = None
    if sampling.do_sample:

        def sampler(logits: torch.Tensor) -> torch.Tensor:
            host = logits.float().cpu().numpy()
            return torch.from_numpy(next_tokens(host, sampling, rng)).to(device)

    with torch.inference_mode():
        state = decode_state(session, batch, max_new_tokens, len(stops), sampler is not None)
        state.reset(stops, pad_id)
        decoder = DeviceDecoder(session, state, sampler)
        feed = {k: _dev(a, device) for k, a in (("input_ids", ids), ("attention_mask", mask))}
        feed["position_ids"] = _dev(positions, device)
        _sync(device)
        start = time.perf_counter()
        source = _prefill(session, state, sampler, feed)
        _sync(device)
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        n = _decode(decoder, source, width, max_new_tokens, bool(stops))
        tokens = state.tokens[:, :n].cpu().numpy()  # waits for the device
        decode_s = time.perf_counter() - start
    return _cut_after_stops(tokens, stops), prefill_s, decode_s


def _decode(
    decoder: DeviceDecoder, source: Any, length: int, max_new_tokens: int, stops: bool
) -> int:
    """Decode steps for tokens 1..max_new_tokens-1; how many tokens were chosen."""
    for t in range(1, max_new_tokens):
        if source is not None:
            decoder.enter(length, *source)
            source = None
        else:
            decoder.step()
        assert decoder.bucket is not None
        if length == decoder.bucket.past:  # the bucket is full: the next step moves on
            source = decoder.handoff()
        length += 1
        if stops and t % STOP_CHECK_EVERY == 0:
            with marked("pgx::stop_check"):
                if bool(decoder.state.done.all()):
                    return t + 1
    return max_new_tokens


def _cut_after_stops(tokens: np.ndarray, stops: set[int]) -> np.ndarray:
    """Tokens up to the step at which every row had emitted a stop token (as the host loop
    stops), all of them when some row never did."""
    if not stops or tokens.size == 0:
        return tokens
    hit = np.isin(tokens, list(stops))
    if not hit.any(axis=1).all():
        return tokens
    return tokens[:, : int(hit.argmax(axis=1).max()) + 1]


def _dev(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
