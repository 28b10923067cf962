"""The driver's `generate` command: text generation with a decoder that carries a KV cache.

    pygraphx-driver generate --model llama_tiny --prompt-ids 1 2 3 --max-new-tokens 32
    pygraphx-driver generate --onnx decoder.onnx --prompt "Hello" --cpu   # tokenizer.json beside
    pygraphx-driver generate --model qwen2_tiny --prompt-ids 5 6 --sample --top-k 40 --seed 1

The built-in models (`gpt2_tiny`, `llama_tiny`, `qwen2_tiny`) are transformers decoders with
small random-weight configurations, exported once with torch/transformers and cached. Tokens (or
text) go to stdout; timings (prefill = time to first token, decode tokens/s, compiled shapes) go
to stderr, or everything to stdout as one JSON object with `--json`.
"""

from __future__ import annotations

import argparse
import json
import sys

from pygraphx.driver.commands import Steps
from pygraphx.driver.inputs import seed_argument
from pygraphx.driver.loader import DriverError
from pygraphx.generate import DecoderSession, SamplingConfig, run_generation
from pygraphx.generate.export import TINY_DECODERS, tiny_decoder_path
from pygraphx.generate.tokenizer import encode


def generate_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--onnx", metavar="FILE", help="a decoder with past/present KV tensors")
    src.add_argument("--model", choices=sorted(TINY_DECODERS), help="a built-in tiny decoder")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", type=int, nargs="+", metavar="ID", help="token ids")
    prompt.add_argument("--prompt", help="text (needs tokenizer.json beside the model)")
    tgt = parser.add_mutually_exclusive_group()
    for name in ("ref", "cpu", "gpu"):
        tgt.add_argument(f"--{name}", dest="target", action="store_const", const=name)
    parser.set_defaults(target="cpu")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--eos", type=int, nargs="*", default=None, help="stop token id(s)")
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=seed_argument, default=None)
    parser.add_argument("--json", action="store_true", help="tokens and timings as JSON")


def cmd_generate(args: argparse.Namespace, steps: Steps) -> int:
    """Prefill the prompt, decode up to --max-new-tokens tokens, print them."""
    try:
        cfg = SamplingConfig(args.sample, args.temperature, args.top_k, args.top_p)
    except ValueError as exc:
        raise DriverError(str(exc)) from None
    with steps("load"):
        path = args.onnx if args.onnx else tiny_decoder_path(args.model)
        ctx = max(len(args.prompt_ids or ()) + args.max_new_tokens, 64) * 2
        session = DecoderSession.open(path, args.target, max_batch=1, max_context=ctx)
    from pygraphx.generate.tokenizer import decode, tokenizer_beside

    tok = tokenizer_beside(path)
    rows = [args.prompt_ids] if args.prompt_ids else encode(tok, [args.prompt], str(path))
    stops = set(args.eos or ())
    pad = min(stops) if stops else 0
    with steps("generate"):
        res = run_generation(session, rows, args.max_new_tokens, cfg, stops, pad, args.seed)
    tokens = res.tokens[0].tolist()
    report = {
        "tokens": tokens,
        "prompt_tokens": res.prompt_tokens,
        "time_to_first_token_s": res.prefill_s,
        "decode_tokens_per_s": res.decode_tokens_per_s,
        "compiled_shapes": res.compiles,
        "target": args.target,
    }
    if tok is not None:
        report["text"] = decode(tok, [tokens])[0]
    if args.json:
        print(json.dumps(report))
        return 0
    print(report.get("text", " ".join(map(str, tokens))))
    print(
        f"time to first token {res.prefill_s * 1e3:.1f} ms, decode "
        f"{res.decode_tokens_per_s:.1f} tokens/s, {res.compiles} shapes compiled",
        file=sys.stderr,
    )
    return 0
