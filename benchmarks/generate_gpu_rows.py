"""The `--device cuda` rows of generate_vs_peers.py: Qwen2-sized fp16 decoders on one GPU.

Configurations (generate_common.py's table; random fp16 weights, seeded, built directly on the
GPU): `qwen2_0_5b` (Qwen2-0.5B sizes) and `qwen2_7b` (Qwen2.5-7B sizes, about 15 GB of
weights). Each is exported once with `pygraphx.generate.export.export_decoder` into `--workdir`
with its weights in external data (one file for the 0.5B; the 7B keeps the one file per weight
torch writes over 2 GB, not rewritten), timed on its own and skipped when the model is
there, then:
- pygraphx: `DecoderSession.open(model, "gpu")` (weights memory-mapped from the data file and
  uploaded once for all bucketed shapes), one warm-up generation that compiles and captures
  every shape, then `--repeat` generations (greedy, no stop token);
- transformers: the same model (same seed) with `generate` in eager mode (sdpa attention), and
  with `--peer-compile` also its static cache + `torch.compile` (recompiles are reported).
Figures: time to first token for the `--prompt-len` prompt (prefill and the first token's
choice), decode tokens/s over `--new` new tokens, peak device memory
(`torch.cuda.max_memory_allocated`), peak host RSS, and whether the tokens agree.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from generate_common import DECODERS, GPU_CONFIGS, decoder_config, time_pygraphx, time_transformers


def build_gpu_model(name: str, attn: str) -> Any:
    """The configuration `name` on cuda:0 in fp16 with seeded random weights (norms 1)."""
    import torch
    import transformers

    config = decoder_config(name)
    config._attn_implementation = attn
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        with torch.device("cuda"):
            model = getattr(transformers, DECODERS[name].arch)(config)
    finally:
        torch.set_default_dtype(default)
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def model_path(workdir: str, name: str) -> Path:
    return Path(workdir) / name / "decoder.onnx"


def export_row(args: Any, name: str) -> dict:
    """Export `name` into the workdir unless it is there; the export's time and peak RSS."""
    from pygraphx.generate.export import export_decoder

    path = model_path(args.workdir, name)
    if path.is_file():
        return {"export_s": None, "note": f"reused {path}"}
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model = build_gpu_model(name, "eager")
    built = time.perf_counter()
    # over 2 GB torch writes one file per weight: kept as they are (each is mapped all the same)
    export_decoder(model, path, external_data="decoder.onnx.data", one_data_file=False)
    files = len(list(path.parent.iterdir()))
    done = time.perf_counter()
    return {"export_s": done - start, "build_s": built - start, "files": files, "path": str(path)}


def gpu_prompt(args: Any, vocab: int) -> list[list[int]]:
    import numpy as np

    return np.random.default_rng(0).integers(0, vocab, (1, args.prompt_len)).tolist()


def pygraphx_row(args: Any, name: str) -> dict:
    import torch

    from pygraphx.generate import DecoderSession

    rows = gpu_prompt(args, DECODERS[name].config["vocab_size"])
    start = time.perf_counter()
    session = DecoderSession.open(
        model_path(args.workdir, name), "gpu", max_batch=1, max_context=args.prompt_len + args.new
    )
    open_s = time.perf_counter() - start
    row = {"open_s": open_s, **time_pygraphx(session, rows, args.new, args.repeat, start)}
    row["peak_device_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def transformers_row(args: Any, name: str, compiled: bool) -> dict:
    import torch

    model = build_gpu_model(name, "sdpa")
    rows = gpu_prompt(args, DECODERS[name].config["vocab_size"])
    ids = torch.tensor(rows, device="cuda")
    kw: dict[str, Any] = {}
    if compiled:
        kw["cache_implementation"] = "static"
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    counters = _recompiles() if compiled else None
    after: list[int | None] = []  # the counter after the warm-up (which compiles)
    row = time_transformers(
        model, ids, args.new, args.repeat,
        after_warmup=(lambda: after.append(_recompiles())) if compiled else None, **kw,
    )  # fmt: skip
    row["peak_device_gb"] = torch.cuda.max_memory_allocated() / 2**30
    if compiled:
        before = after[0]
        row["compiles_warmup"] = (before or 0) - (counters or 0)
        row["recompiles_timed"] = (_recompiles() or 0) - (before or 0)
    return row


def _recompiles() -> int | None:
    """Frames dynamo compiled so far (None when the counter is not there)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(sum(counters["stats"].get(k, 0) for k in ("unique_graphs",)))


def worker(args: Any) -> None:
    """One row in this process (see `spawn_gpu`)."""
    name, engine = args.models, args.engine
    if engine == "export":
        row = export_row(args, name)
    elif engine == "pygraphx":
        row = pygraphx_row(args, name)
    else:
        row = transformers_row(args, name, compiled=engine == "transformers-compile")
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(row))


def spawn_gpu(args: Any, engine: str, name: str) -> dict:
    cmd = [
        sys.executable, sys.argv[0], "--worker", "--device", "cuda", "--engine", engine,
        "--models", name, "--workdir", args.workdir, "--prompt-len", str(args.prompt_len),
        "--new", str(args.new), "--repeat", str(args.repeat),
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        return {"error": proc.stderr.strip().splitlines()[-1:] or ["failed"]}
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["wall_s"] = time.perf_counter() - start
    return row


def run_gpu(args: Any) -> list[dict]:
    """Every configuration of `--configs`: export (or reuse), pygraphx, transformers."""
    engines = ["export", "pygraphx", "transformers"]
    if args.peer_compile:
        engines.append("transformers-compile")
    rows = []
    for name in args.configs.split(","):
        if name not in GPU_CONFIGS:
            raise SystemExit(f"unknown config {name!r}; known: {sorted(GPU_CONFIGS)}")
        got = {}
        for engine in engines:
            got[engine] = spawn_gpu(args, engine, name)
            rows.append(
                {"model": name, "target": "gpu", "batch": 1, "engine": engine, **got[engine]}
            )
            print(
                json.dumps({k: v for k, v in rows[-1].items() if k != "tokens"}),
                file=sys.stderr,
                flush=True,
            )
        mine = got["pygraphx"].get("tokens")
        for r in rows[-len(engines) :]:
            if mine is not None and "tokens" in r and r["engine"] != "pygraphx":
                r["same_tokens"] = r["tokens"] == mine
                r["same_prefix"] = _common_prefix(r["tokens"][0], mine[0])
    return rows


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
