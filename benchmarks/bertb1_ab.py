"""A/B of two `cpu` compilations of one transformer in one process, the programs alternating.

    PYTHONPATH=. python benchmarks/bertb1_ab.py --model bert_base --threads 2 --ab attention
    PYTHONPATH=. python benchmarks/bertb1_ab.py --model gpt2 --bf16 --ab attention

`--ab attention`: A is the default (oneDNN's attention primitives), B `onednn_attention=False`
(float32: torch's fused kernel); `--ab layernorm`: B with `PGX_CPU_LAYERNORM=torch` (torch's layer-
norm kernel, no norm written over its input). Each round runs A then B (and B then A in odd rounds);
the figures are each program's median wall ms and process CPU ms a run, and its blocks (sums of each
step's fastest wall time over as many profiled rounds, again alternating). Load adaptation is off
(`PGX_CPU_LOAD_ADAPT=0`): both programs use the asked threads on a busy machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bertb1_profile  # noqa: E402
import cpu_transformer_blocks as ctb  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.cpu.threads import LOAD_ADAPT_ENV  # noqa: E402

#: `--ab` name -> B's compile settings and environment (set while B compiles)
VARIANTS = {
    "attention": ({"onednn_attention": False}, {}),
    "layernorm": ({}, {"PGX_CPU_LAYERNORM": "torch"}),
}


def compile_b(data: bytes, args: argparse.Namespace) -> object:
    settings, env = VARIANTS[args.ab]
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return ctb.compile_pgx(data, args, **settings)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load(name: str, batch: int) -> tuple[bytes, dict]:
    """The model's bytes and inputs: a generated BERT-base / GPT-2 of `batch`, or a zoo model
    (`benchmarks/zoo.py`, full size: ViT-B/16 at batch 1, MiniLM 8 x 128)."""
    if name in ("vit_b16", "minilm"):
        import zoo

        path, feeds = zoo.zoo_model(name, "full")
        return Path(path).read_bytes(), feeds
    model = get_model(name, batch=batch)
    return model.SerializeToString(), model_inputs(name, model)


def ctb_error(got: list, want: list) -> float:
    """The largest relative RMS error of `got` against `want` over the outputs."""
    return max(
        float(
            np.sqrt(
                np.mean((np.asarray(g, np.float64) - w) ** 2)
                / np.mean(np.square(w, dtype=np.float64))
            )
        )
        for g, w in zip(got, want, strict=True)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bert_base",
                    choices=["bert_base", "gpt2", "vit_b16", "minilm"])  # fmt: skip
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--ab", choices=sorted(VARIANTS), default="attention")
    args = ap.parse_args(argv)
    os.environ[LOAD_ADAPT_ENV] = "0"
    import torch

    torch.set_num_threads(args.threads)
    data, feeds = load(args.model, args.batch)
    progs = {
        "A": ctb.compile_pgx(data, args),
        "B": compile_b(data, args),
    }
    import onnxruntime as ort

    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    errors = {k: ctb_error(p.run(feeds), want) for k, p in progs.items()}
    wall, cpu = defaultdict(list), defaultdict(list)
    for r in range(args.rounds):
        for k in ("A", "B") if r % 2 == 0 else ("B", "A"):
            c0, w0 = ctb.cpu_seconds(), time.perf_counter()
            progs[k].run(feeds)
            wall[k].append(time.perf_counter() - w0)
            cpu[k].append(ctb.cpu_seconds() - c0)
    fastest = {k: [float("inf")] * len(p._executable.lowered.steps) for k, p in progs.items()}
    for r in range(args.rounds):
        for k in ("A", "B") if r % 2 == 0 else ("B", "A"):
            bertb1_profile.profiled_run(progs[k], feeds, fastest[k])
    blocks = {}
    for k, p in progs.items():
        found = defaultdict(float)
        for name, s in bertb1_profile.step_kinds(p, fastest[k]).items():
            found[name.split(":")[0]] += s
        blocks[k] = found
    precision = "bf16" if args.bf16 else "float32"
    print(f"{args.model} b{args.batch} {precision} {args.threads} thread(s), --ab {args.ab} "
          f"(B: {VARIANTS[args.ab]}), {args.rounds} rounds")  # fmt: skip
    for k in progs:
        cells = ", ".join(f"{b} {blocks[k].get(b, 0) * 1e3:.2f}" for b in ctb.BLOCKS)
        print(f"  {k}: rel. RMS error against ORT {errors[k]:.2e}; wall "
              f"{np.median(wall[k]) * 1e3:.1f} ms (min {min(wall[k]) * 1e3:.1f}), CPU "
              f"{np.median(cpu[k]) * 1e3:.1f} ms; blocks (fastest) {cells}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
