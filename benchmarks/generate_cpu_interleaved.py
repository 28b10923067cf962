"""pygraphx vs transformers eager decoding on the CPU, interleaved in one process.

    python benchmarks/generate_cpu_interleaved.py --model qwen2_small --threads 2 --rounds 5

For a loaded or shared machine: `generate_vs_peers.py` runs each engine in its own process one
after the other, so load that comes and goes between them lands on one engine only. Here both
run in one process with the same torch thread count and alternate, round by round (pygraphx
generation, then transformers `generate(1)` and `generate(new)`), so drifting load hits both;
the medians over `--rounds` are reported with each round's figures. Same random-weight model
(`generate_vs_peers.build_model`), same prompt, greedy; the tokens are compared. Peak memory is
not separated here (one process): take it from `generate_vs_peers.py`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import generate_vs_peers as peers

import pygraphx  # noqa: F401  (before torch: its OpenMP settings apply when torch loads)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2_small")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    import torch

    from pygraphx.generate import DecoderSession, SamplingConfig, run_generation
    from pygraphx.generate.export import export_decoder
    from pygraphx.targets import get_target

    torch.set_num_threads(args.threads)
    model = peers.build_model(args.model)
    rows = peers.prompts(1, args.prompt_len, model.config.vocab_size)
    session = DecoderSession.open(
        export_decoder(model),
        get_target("cpu", threads=args.threads),
        max_batch=1,
        max_context=2 * (args.prompt_len + args.new),
    )
    ids = torch.tensor(rows)

    def ours() -> tuple[float, float, list[int]]:
        r = run_generation(session, rows, args.new, SamplingConfig(), set(), 0, None)
        return r.prefill_s, r.decode_tokens_per_s, r.tokens[0].tolist()

    def theirs(n: int) -> tuple[float, list[int]]:
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip
        return time.perf_counter() - start, out[0, args.prompt_len :].tolist()

    ours(), theirs(args.new)  # warm-up: pygraphx compiles its shapes
    rounds = []
    for _ in range(args.rounds):
        ttft, tok_s, mine = ours()
        t1, _ = theirs(1)
        tn, peer = theirs(args.new)
        hf = (args.new - 1) / max(tn - t1, 1e-9)
        rounds.append({"pgx_ttft_ms": ttft * 1e3, "pgx_tok_s": tok_s, "hf_ttft_ms": t1 * 1e3,
                       "hf_tok_s": hf, "same_tokens": mine == peer})  # fmt: skip
        print(json.dumps(rounds[-1]), flush=True)
    summary = {k: statistics.median(r[k] for r in rounds) for k in rounds[0] if k != "same_tokens"}
    summary["same_tokens"] = all(r["same_tokens"] for r in rounds)
    summary.update(model=args.model, threads=args.threads, prompt_len=args.prompt_len,
                   new=args.new, rounds=args.rounds)  # fmt: skip
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "rounds": rounds}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
