"""What generate_vs_peers.py and generate_gpu_rows.py share: the benchmark decoders'
configurations (one table, shaped like `pygraphx.generate.export.TINY_DECODERS`) and the timing
of one engine's generations.

Both timings run one warm-up generation, then `repeat` timed ones, and report medians:
- pygraphx (`time_pygraphx`): its loop's own clock for the time to first token and the decode
  tokens/s; the warm-up compiles every bucketed shape, so `compile_s` runs from `start` (the
  caller's clock before it opened the session) to the end of the warm-up;
- transformers (`time_transformers`): `generate` with one new token is the time to first token,
  `generate(new) - generate(1)` the decode time of (new - 1) * batch tokens; on cuda every
  generation is bracketed by `torch.cuda.synchronize`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from pygraphx.generate.export import TinyDecoder

#: the benchmarks' decoders beyond `TINY_DECODERS`: `qwen2_small` (a 4-layer 512-wide Qwen2, the
#: cpu rows) and the Qwen2-0.5B and Qwen2.5-7B sizes (the `--device cuda` rows)
DECODERS: dict[str, TinyDecoder] = {
    "qwen2_small": TinyDecoder(
        "Qwen2ForCausalLM",
        "Qwen2Config",
        dict(
            vocab_size=8000,
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            max_position_embeddings=1024,
        ),
    ),
    "qwen2_0_5b": TinyDecoder(
        "Qwen2ForCausalLM",
        "Qwen2Config",
        dict(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            max_position_embeddings=4096,
        ),
    ),
    "qwen2_7b": TinyDecoder(
        "Qwen2ForCausalLM",
        "Qwen2Config",
        dict(
            vocab_size=152064,
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            tie_word_embeddings=False,
            max_position_embeddings=4096,
        ),
    ),
}

#: the `--device cuda` rows' configurations
GPU_CONFIGS = ("qwen2_0_5b", "qwen2_7b")


def decoder_config(name: str) -> Any:
    """The transformers configuration of `DECODERS[name]`."""
    import transformers

    spec = DECODERS[name]
    return getattr(transformers, spec.config_class)(**spec.config)


def time_pygraphx(session: Any, rows: list[list[int]], new: int, repeat: int, start: float) -> dict:
    """Warm-up and `repeat` greedy generations of `new` tokens on an open `DecoderSession`."""
    from pygraphx.generate import SamplingConfig, run_generation

    gen = lambda: run_generation(session, rows, new, SamplingConfig(), set(), 0, None)  # noqa: E731
    gen()  # warm-up: compiles (and on gpu captures) every bucketed shape
    compile_s = time.perf_counter() - start
    results = [gen() for _ in range(repeat)]
    return {
        "compile_s": compile_s,
        "compiled_shapes": session.compile_count,
        "ttft_s": statistics.median(r.prefill_s for r in results),
        "decode_tok_s": statistics.median(r.decode_tokens_per_s for r in results),
        "tokens": results[0].tokens.tolist(),
    }


def time_transformers(
    model: Any,
    ids: Any,
    new: int,
    repeat: int,
    *,
    after_warmup: Callable[[], None] | None = None,
    **generate_kw: Any,
) -> dict:
    """Warm-up and timed greedy `model.generate` runs on the prompt `ids` ([batch, prompt]);
    `after_warmup` runs between the warm-up and the timed runs."""
    import torch

    cuda = ids.device.type == "cuda"
    mask = torch.ones_like(ids)

    def gen(n: int) -> tuple[float, Any]:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                pad_token_id=0, **generate_kw,
            )  # fmt: skip
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start, out

    gen(new)  # warm-up
    if after_warmup is not None:
        after_warmup()
    ttft = statistics.median(gen(1)[0] for _ in range(repeat))
    full = [gen(new) for _ in range(repeat)]
    total = statistics.median(t for t, _ in full)
    steps = (new - 1) * ids.shape[0]
    return {
        "ttft_s": ttft,
        "decode_tok_s": steps / max(total - ttft, 1e-9),
        "tokens": full[0][1][:, ids.shape[1] :].tolist(),
    }
