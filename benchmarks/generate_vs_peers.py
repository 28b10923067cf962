"""pygraphx.generate vs transformers `generate` (eager) on the same random-weight decoders.

    python benchmarks/generate_vs_peers.py                      # cpu, batch 1 and 8
    python benchmarks/generate_vs_peers.py --models qwen2_small --batches 1 --json out.json
    python benchmarks/generate_vs_peers.py --gpu                # also on the GPU (when present)
    python benchmarks/generate_vs_peers.py --device cuda --configs qwen2_0_5b --json out.json

`--device cuda` runs the Qwen2-sized fp16 rows instead (`generate_gpu_rows.py`: export timed on
its own, pygraphx gpu vs transformers eager, `--peer-compile` adds static cache +
torch.compile); `--configs` picks `qwen2_0_5b` and/or `qwen2_7b` (one device call each).

Each (engine, model, batch, device) row runs in its own subprocess, so its peak resident memory
(`ru_maxrss`, the whole process: Python, torch, weights, caches) is its own. The models are
transformers decoders with random weights (the tiny test configurations and `qwen2_small`,
a 4-layer 512-wide Qwen2), exported with `pygraphx.generate.export` (KV cache as graph
inputs/outputs). Prompt: `--prompt-len` random ids (default 128); `--new` tokens (default 64),
greedy, no early stop.

Figures, each the median of `--repeat` runs after one warm-up run (which compiles every shape
pygraphx needs; its compile time is reported separately):
- time to first token (TTFT): prefill and the choice of the first token;
- decode tokens/s: (new - 1) * batch tokens over the time of the decode steps;
- pygraphx's times come from its loop's own clock; transformers' TTFT is `generate` with one new
  token, its decode time is `generate(new) - generate(1)`.
Both engines use the same torch thread count (the cpu target's). The tokens of both engines are
compared (greedy, fp32): `same_tokens` in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

from generate_common import DECODERS, decoder_config, time_pygraphx, time_transformers

import pygraphx  # noqa: F401  (before torch: its OpenMP settings apply when torch loads)


def build_model(name: str) -> Any:
    from pygraphx.generate import export

    if name in export.TINY_DECODERS:
        return export.tiny_model(name)
    import torch
    import transformers

    config = decoder_config(name)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return getattr(transformers, DECODERS[name].arch)(config).eval()


def prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.integers(0, vocab, (batch, length)).tolist()


def run_pygraphx(args: argparse.Namespace, model: Any, rows: list[list[int]]) -> dict:
    from pygraphx.generate import DecoderSession
    from pygraphx.generate.export import export_decoder

    start = time.perf_counter()
    data = export_decoder(model)
    export_s = time.perf_counter() - start
    start = time.perf_counter()
    from pygraphx.targets import get_target

    kw = {"threads": args.threads} if args.target == "cpu" else {}
    session = DecoderSession.open(
        data,
        get_target(args.target, **kw),
        max_batch=len(rows),
        max_context=2 * (args.prompt_len + args.new),
    )
    return {"export_s": export_s, **time_pygraphx(session, rows, args.new, args.repeat, start)}


def run_transformers(args: argparse.Namespace, model: Any, rows: list[list[int]]) -> dict:
    import torch

    device = "cuda" if args.target == "gpu" else "cpu"
    model = model.to(device)
    ids = torch.tensor(rows, device=device)
    return time_transformers(model, ids, args.new, args.repeat)


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    model = build_model(args.model)
    rows = prompts(args.batch, args.prompt_len, model.config.vocab_size)
    run = run_pygraphx if args.engine == "pygraphx" else run_transformers
    row = run(args, model, rows)
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(row))


def spawn(args: argparse.Namespace, engine: str, model: str, batch: int, target: str) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--engine",
        engine,
        "--models",
        model,
        "--batches",
        str(batch),
        "--target",
        target,
        "--threads",
        str(args.threads),
        "--prompt-len",
        str(args.prompt_len),
        "--new",
        str(args.new),
        "--repeat",
        str(args.repeat),
    ]
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or ["failed"]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    head = (
        f"{'model':12} {'dev':4} {'b':>2} {'engine':12} {'TTFT ms':>9} {'decode tok/s':>13} "
        f"{'peak MB':>8} {'compile s':>9} {'shapes':>6} same"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(
                f"{r['model']:12} {r['target']:4} {r['batch']:>2} {r['engine']:12} "
                f"error: {r['error']}"
            )
            continue
        lines.append(
            f"{r['model']:12} {r['target']:4} {r['batch']:>2} {r['engine']:12} "
            f"{r['ttft_s'] * 1e3:9.1f} {r['decode_tok_s']:13.1f} {r['peak_rss_mb']:8.0f} "
            f"{r.get('compile_s', float('nan')):9.2f} {r.get('compiled_shapes', ''):>6} "
            f"{r.get('same_tokens', '')}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="llama_tiny,qwen2_small")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--gpu", action="store_true", help="also run on the GPU when torch sees one")
    p.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--target", default="cpu", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--configs", default="qwen2_0_5b,qwen2_7b", help="--device cuda: configs")
    p.add_argument("--workdir", default="/tmp/pgx_gen_models", help="--device cuda: exports")
    p.add_argument("--peer-compile", action="store_true", help="also static cache + compile")
    args = p.parse_args(argv)
    if args.device == "cuda":
        return main_cuda(args)
    if args.threads is None:
        from pygraphx.targets.cpu.threads import resolve_threads

        args.threads = resolve_threads(None).n
    if args.worker:
        args.model, args.batch = args.models, int(args.batches)
        worker(args)
        return 0
    targets = ["cpu"]
    if args.gpu:
        import torch

        targets += ["gpu"] if torch.cuda.is_available() else []
    rows = []
    for target in targets:
        for model in args.models.split(","):
            for batch in map(int, args.batches.split(",")):
                pair = {}
                for engine in ("pygraphx", "transformers"):
                    row = spawn(args, engine, model, batch, target)
                    pair[engine] = row
                    rows.append(
                        {"model": model, "target": target, "batch": batch, "engine": engine, **row}
                    )
                if all("tokens" in r for r in pair.values()):
                    same = pair["pygraphx"]["tokens"] == pair["transformers"]["tokens"]
                    rows[-2]["same_tokens"] = rows[-1]["same_tokens"] = same
                print("\n".join(table(rows[-2:]).splitlines()[-2:]), file=sys.stderr, flush=True)
    for r in rows:
        r.pop("tokens", None)
    print(f"threads: {args.threads}, prompt {args.prompt_len} tokens, {args.new} new, greedy")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "threads": args.threads,
                    "prompt_len": args.prompt_len,
                    "new": args.new,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


def main_cuda(args: argparse.Namespace) -> int:
    """The `--device cuda` rows (see `generate_gpu_rows.py`)."""
    import generate_gpu_rows as gpu

    if args.worker:
        gpu.worker(args)
        return 0
    if args.new == 64 and "--new" not in sys.argv:
        args.new = 128
    rows = gpu.run_gpu(args)
    for r in rows:
        r.pop("tokens", None)
    print(f"GPU, batch 1, fp16, prompt {args.prompt_len} tokens, {args.new} new, greedy")
    for r in rows:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prompt_len": args.prompt_len, "new": args.new, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
