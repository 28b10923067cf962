"""The generation loop: left-padded prompts, one prefill step, then one decode step per token.

`generate(model, input_ids, max_new_tokens=...)` takes a model path, ONNX bytes, a parsed
`Program` or an open `DecoderSession` (reuse one to keep its compiled shapes), and token ids
(one prompt or a batch of prompts of any lengths) or text when a tokenizer is at hand.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pygraphx.generate.device_loop import run_device_generation
from pygraphx.generate.sampling import SamplingConfig, next_tokens
from pygraphx.generate.session import DecoderSession, GenerateError, bucket
from pygraphx.generate.tokenizer import decode, encode, tokenizer_beside

PROMPT_MIN = 8


@dataclass
class GenerationResult:
    """New tokens [batch, n] (rows stopped early are filled with the pad id) and timings."""

    tokens: np.ndarray
    prompt_tokens: int
    prefill_s: float  # the prefill step = time to first token (first token chosen with it)
    decode_s: float  # all decode steps
    compiles: int  # distinct shapes this session has compiled

    @property
    def decode_tokens_per_s(self) -> float:
        steps = max(self.tokens.shape[1] - 1, 0) * self.tokens.shape[0]
        return steps / self.decode_s if self.decode_s > 0 else float("nan")


def _as_rows(input_ids: Any) -> list[list[int]]:
    if isinstance(input_ids, np.ndarray):
        arr = input_ids if input_ids.ndim == 2 else input_ids[None]
        return [list(map(int, r)) for r in arr]
    if isinstance(input_ids, Sequence) and input_ids and isinstance(input_ids[0], Sequence):
        return [list(map(int, r)) for r in input_ids]
    return [list(map(int, input_ids))]


def left_pad(rows: list[list[int]], pad_id: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) [batch, width], each prompt right-aligned, padding masked with 0."""
    ids = np.full((len(rows), width), pad_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        if not r:
            raise GenerateError(f"prompt {i} is empty")
        ids[i, width - len(r) :] = r
        mask[i, width - len(r) :] = 1
    return ids, mask


def _stop_set(eos_token_id: int | Sequence[int] | None) -> set[int]:
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, int | np.integer):
        return {int(eos_token_id)}
    return {int(t) for t in eos_token_id}


def run_generation(
    session: DecoderSession,
    rows: list[list[int]],
    max_new_tokens: int,
    sampling: SamplingConfig,
    stops: set[int],
    pad_id: int,
    seed: int | None,
    prompt_bucket: bool = True,
) -> GenerationResult:
    """Prefill `rows` (left-padded) and decode up to `max_new_tokens` tokens per row.

    With `prompt_bucket` the prompts are left-padded (masked) to a power-of-two length of at
    least `PROMPT_MIN`, so prompts of many lengths share a handful of compiled prefill shapes.
    """
    if max_new_tokens < 1:
        raise GenerateError(f"max_new_tokens must be >= 1 (got {max_new_tokens})")
    rng = np.random.default_rng(seed)
    width = max(len(r) for r in rows)
    if prompt_bucket:
        width = bucket(width, PROMPT_MIN)
    ids, mask = left_pad(rows, pad_id, width)
    if session.device is not None:
        tokens, prefill_s, decode_s = run_device_generation(
            session, ids, mask, max_new_tokens, sampling, stops, pad_id, rng
        )
        prompt = max(len(r) for r in rows)
        return GenerationResult(tokens, prompt, prefill_s, decode_s, session.compile_count)
    batch = len(rows)
    cache = session.new_cache(batch, bucket(width + max_new_tokens))
    valid = np.zeros((batch, cache[0].shape[2]), np.int64)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    positions = np.where(mask == 0, 1, positions)
    next_pos = positions[:, -1] + 1
    start = time.perf_counter()
    logits = session.step(cache, valid, 0, ids, mask, positions)
    out = np.full((batch, max_new_tokens), pad_id, np.int64)
    done = np.zeros(batch, bool)
    length = width
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    for t in range(max_new_tokens):
        tok = np.where(done, pad_id, next_tokens(logits, sampling, rng))
        out[:, t] = tok
        done |= np.isin(tok, list(stops)) if stops else False
        if t == 0:
            prefill_s += time.perf_counter() - start
            start = time.perf_counter()
        if done.all() or t == max_new_tokens - 1:
            out = out[:, : t + 1]
            break
        ones = np.ones((batch, 1), np.int64)
        logits = session.step(cache, valid, length, tok[:, None], ones, next_pos[:, None])
        length += 1
        next_pos += 1
    decode_s = time.perf_counter() - start
    return GenerationResult(
        out, max(len(r) for r in rows), prefill_s, decode_s, session.compile_count
    )


def open_session(
    model: Any, target: Any, max_batch: int, max_context: int
) -> tuple[DecoderSession, Any]:
    """A session for `model` and the tokenizer beside it (None when there is none)."""
    if isinstance(model, DecoderSession):
        return model, getattr(model, "tokenizer", None)
    session = DecoderSession.open(model, target, max_batch=max_batch, max_context=max_context)
    path = model if isinstance(model, str | Path) else None
    session.tokenizer = tokenizer_beside(path)
    return session, session.tokenizer


def generate(
    model: Any,
    input_ids: Any,
    max_new_tokens: int = 32,
    target: Any = "cpu",
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    do_sample: bool = False,
    top_k: int = 0,
    top_p: float = 1.0,
    temperature: float = 1.0,
    seed: int | None = None,
    tokenizer: Any = None,
    max_context: int = 1024,
) -> Any:
    """Generate tokens after each prompt: prefill, then one decode step per new token.

    Args:
        model: a decoder ONNX file (or its bytes, a parsed `Program`, or a `DecoderSession` to
            reuse compiled shapes) with `past_key_values.N.key|value` inputs and `present.N.*`
            outputs.
        input_ids: one prompt (ids, or text when a `tokenizer.json` is beside the model or
            `tokenizer=` is given) or a batch of prompts of any lengths (left-padded).
        max_new_tokens: tokens generated per prompt at most.
        target: `"ref"`, `"cpu"` or `"gpu"` (or a `Target`).
        eos_token_id: stop token(s); a row that emits one stops, later slots get `pad_token_id`
            (default: the smallest stop id, else 0). All rows stopped: the loop ends.
        do_sample, top_k, top_p, temperature, seed: sampling (greedy unless `do_sample`); the
            same seed gives the same tokens.

    Returns:
        int64 array [batch, n] of new tokens (1-D for one unbatched prompt), or text.

    Example:
        >>> ids = pygraphx.generate("decoder.onnx", [[1, 2, 3], [4, 5]], max_new_tokens=8)
        >>> ids.shape
        (2, 8)
    """
    rows_in = [input_ids] if isinstance(input_ids, str) else input_ids
    text = isinstance(rows_in, list) and bool(rows_in) and isinstance(rows_in[0], str)
    n_rows = len(rows_in) if text else len(_as_rows(input_ids))
    session, found = open_session(model, target, max(n_rows, 1), max_context)
    tok = tokenizer or found
    rows = encode(tok, rows_in, str(model)) if text else _as_rows(input_ids)
    stops = _stop_set(eos_token_id)
    pad = pad_token_id if pad_token_id is not None else (min(stops) if stops else 0)
    cfg = SamplingConfig(do_sample, temperature, top_k, top_p)
    result = run_generation(session, rows, max_new_tokens, cfg, stops, pad, seed)
    if text:
        texts = decode(tok, [_strip(r, stops) for r in result.tokens.tolist()])
        return texts[0] if isinstance(input_ids, str) else texts
    single = (
        not isinstance(input_ids, np.ndarray)
        and len(_as_rows(input_ids)) == 1
        and not (input_ids and isinstance(input_ids[0], Sequence))
    )
    single = single or (isinstance(input_ids, np.ndarray) and input_ids.ndim == 1)
    return result.tokens[0] if single else result.tokens


def _strip(row: list[int], stops: set[int]) -> list[int]:
    """A row cut after its first stop token."""
    for i, t in enumerate(row):
        if t in stops:
            return row[: i + 1]
    return row
