"""A/B of two `cpu` compilations of one transformer in one process, the programs alternating.

    PYTHONPATH=. python benchmarks/bertb1_ab.py --model bert_base --threads 2 --ab attention
    PYTHONPATH=. python benchmarks/bertb1_ab.py --model gpt2 --bf16 --ab attention

`--ab attention`: A is the default (oneDNN's attention primitives), B `onednn_attention=False`
(float32: torch's fused kernel); `--ab layernorm`: B with `PGX_CPU_LAYERNORM=torch` (torch's layer-
norm kernel, no norm written over its input). A wrapper of `benchmarks/ab_harness.py` (the one
harness, `--steps` always on, steps grouped by `cpu_transformer_blocks.pgx_block`): each round
runs A then B (and B then A in odd rounds); the figures are each program's median ms a run (wall
at 2 threads, thread CPU at 1) and process CPU ms, and its blocks (sums of each step's median
over as many profiled rounds, again alternating). Load adaptation is off
(`PGX_CPU_LOAD_ADAPT=0`): both programs use the asked threads on a busy machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cpu_transformer_blocks as ctb  # noqa: E402

from benchmarks import ab_harness as ab  # noqa: E402
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


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=[], threads=2, rounds=20, env_options=False)
    p.add_argument("--model", default="bert_base",
                   choices=["bert_base", "gpt2", "vit_b16", "minilm"])  # fmt: skip
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ab", choices=sorted(VARIANTS), default="attention")
    args = p.parse_args(argv)
    os.environ[LOAD_ADAPT_ENV] = "0"
    target, env = VARIANTS[args.ab]
    b_env = {**env, **{f"{ab.TARGET}{k}": repr(v) for k, v in target.items()}}
    variants = [ab.Variant("A", bf16=args.bf16, label="default"),
                ab.Variant("B", b_env, args.bf16)]  # fmt: skip
    data, feeds = load(args.model, args.batch)
    case = ab.Case(f"{args.model} b{args.batch} --ab {args.ab}", data, feeds)
    cfgs = [replace(c, steps=True, kind_of=ctb.pgx_block) for c in ab.configs_of(args)]
    return ab.run([case], variants, cfgs, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
