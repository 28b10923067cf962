"""A/B in one process: the native bf16 attention kernel (B) against the oneDNN route (A).

    PYTHONPATH=. python benchmarks/attn13_ab.py blocks --threads 1 --rounds 15
    PYTHONPATH=. python benchmarks/attn13_ab.py models --threads 2 --rounds 10 \
        --models minilm bert_base:1 bert_base:8

`blocks`: one attention block, bf16, Q / K / V the strided head views of one fused
(b, s, 3 * h * d) product, BERT-base's (h 12, d 64, s 128, padding mask), MiniLM's (h 12, d 32,
s 128, padding mask) and ViT-B/16's (h 12, d 64, s 197, no mask) at batch 1 and 8. A is
`onednn_attention.attend` (the route before), B `native_attention.attend`. Each round times
`--calls` calls of each (A B in even rounds, B A in odd ones); printed: the median over rounds
of the time per call (thread CPU time at one thread, wall at more), and each one's relative
RMS error against a float64 reference.

`blocks --causal` (gpt14): GPT-2's causal block (h 12, d 64, Q / K / V strided head views of
one fused product, s 128, and s 77 / 256 for a tail and a longer one), bf16 (or float32 with
`--f32`): A the native kernel's full path with the causal mask the lowering built before
(`where(tril, 0, finfo.min)`, (1, 1, s, s)), B `native_attention.attend_causal` (the key
blocks a query block does not see skipped, no mask read); same timing and error as above, and
A vs B max difference (0 expected: masked scores weigh exactly 0 either way).

`models`: `benchmarks/ab_harness.py` (the one harness) on the models compiled twice at bf16
(`quantize_bf16`, its default policy), A with `PGX_CPU_NATIVE_ATTENTION=0` and B with it 1, run
in turn (A B, then B A); printed: the median run (thread CPU time at one thread, wall at more),
the A/B output difference and each one's relative RMS error against ONNX Runtime float32.
`--f32`: float32 programs, A with `PGX_CPU_NATIVE_ATTENTION_F32=0` (the kernel's FMA variant
off), B with it 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: its tree wins

import pygraphx  # noqa: E402,F401  (before torch: it sets OpenMP's spin count)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from pygraphx.targets.torch_lowering import native_attention, onednn_attention  # noqa: E402
from pygraphx.targets.torch_lowering.attention import _bf16_attention  # noqa: E402

SHAPES = {  # name: (heads, head width, sequence, mask)
    "bert_base": (12, 64, 128, True),
    "minilm": (12, 32, 128, True),
    "vit_b16": (12, 64, 197, False),
}


def operands(b: int, h: int, d: int, s: int, masked: bool) -> tuple:
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(b, s, 3, h, d, generator=gen).bfloat16()
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    mask = None
    if masked:
        mask = torch.zeros(b, 1, 1, s)
        mask[..., -9:] = -1e4
    return q, k.transpose(-1, -2), v, mask


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def blocks(args: argparse.Namespace) -> None:
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"blocks, {args.threads} thread(s), {args.rounds} rounds of {args.calls} calls, "
          f"{'thread CPU' if args.threads == 1 else 'wall'} us per call, median: "
          "A (oneDNN) / B (native)")  # fmt: skip
    for name, (h, d, s, masked) in SHAPES.items():
        for b in args.batches:
            q, kt, v, mask = operands(b, h, d, s, masked)
            scale = d**-0.5
            fns = {
                "A": onednn_attention.attend(scale, {}, _bf16_attention(scale)),
                "B": native_attention.attend(scale, {}, _bf16_attention(scale)),
            }
            ref = (q.double() @ kt.double()) * scale
            ref = torch.softmax(ref if mask is None else ref + mask.double(), -1) @ v.double()
            errs = {n: rel_err(f(q, kt, v, mask), ref) for n, f in fns.items()}
            times: dict[str, list[float]] = {"A": [], "B": []}
            for r in range(args.rounds):
                for n in ("A", "B") if r % 2 == 0 else ("B", "A"):
                    f = fns[n]
                    start = clock()
                    for _ in range(args.calls):
                        f(q, kt, v, mask)
                    times[n].append((clock() - start) / args.calls)
            a, bb = np.median(times["A"]) * 1e6, np.median(times["B"]) * 1e6
            print(f"  {name:9s} b{b} (h, s, d) = ({h}, {s}, {d}): {a:8.1f} / {bb:8.1f} us "
                  f"(B/A {bb / a:.2f}); rel err A {errs['A']:.1e}, B {errs['B']:.1e}")


CAUSAL_SEQS = (128, 77, 256)


def causal_blocks(args: argparse.Namespace) -> None:
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    dtype = torch.float32 if args.f32 else torch.bfloat16
    print(f"causal blocks {dtype}, {args.threads} thread(s), {args.rounds} rounds of {args.calls} "
          f"calls, {'thread CPU' if args.threads == 1 else 'wall'} us per call, median: A (full "
          "kernel, causal mask) / B (causal skipping)")  # fmt: skip
    h, d = 12, 64
    for s in CAUSAL_SEQS:
        for b in args.batches:
            q, kt, v, _ = operands(b, h, d, s, False)
            q, kt, v = q.to(dtype), kt.to(dtype), v.to(dtype)
            keep = torch.ones(s, s, dtype=torch.bool).tril()
            mask = torch.where(keep, 0.0, torch.finfo(torch.float32).min).view(1, 1, s, s)
            scale = d**-0.5
            full = native_attention.attend(scale, {}, _bf16_attention(scale), dtype)
            causal = native_attention.attend_causal(scale, {}, dtype, 0)
            assert causal is not None, "causal kernel unavailable"
            fns = {"A": lambda: full(q, kt, v, mask), "B": lambda: causal(q, kt, v)}
            ref = (q.double() @ kt.double()) * scale + mask.double()
            ref = torch.softmax(ref, -1) @ v.double()
            outs = {n: f() for n, f in fns.items()}
            errs = {n: rel_err(o, ref) for n, o in outs.items()}
            diff = float((outs["A"].float() - outs["B"].float()).abs().max())
            times: dict[str, list[float]] = {"A": [], "B": []}
            for r in range(args.rounds):
                for n in ("A", "B") if r % 2 == 0 else ("B", "A"):
                    f = fns[n]
                    start = clock()
                    for _ in range(args.calls):
                        f()
                    times[n].append((clock() - start) / args.calls)
            a, bb = np.median(times["A"]) * 1e6, np.median(times["B"]) * 1e6
            print(f"  gpt2 b{b} (h, s, d) = ({h}, {s}, {d}): {a:8.1f} / {bb:8.1f} us "
                  f"(B/A {bb / a:.2f}); rel err A {errs['A']:.1e}, B {errs['B']:.1e}; "
                  f"A vs B max diff {diff:.1e}")  # fmt: skip


def load(spec: str) -> tuple[bytes, dict[str, np.ndarray]]:
    """The model's bytes and feeds (`benchmarks/ab_harness.load`)."""
    from benchmarks.ab_harness import load as ab_load

    case = ab_load(spec)
    return case.data, case.feeds


def models(args: argparse.Namespace) -> int:
    """`benchmarks/ab_harness.py` on the models: A the kernel's switch off, B on."""
    from benchmarks import ab_harness as ab
    from pygraphx.targets.torch_lowering.attention import NATIVE_F32_ENV

    env = NATIVE_F32_ENV if args.f32 else native_attention.ENV
    variants = [ab.Variant("A", {env: "0"}, not args.f32, label="oneDNN"),
                ab.Variant("B", {env: "1"}, not args.f32, label="native")]  # fmt: skip
    cfg = ab.Config(threads=args.threads, rounds=args.rounds)
    return ab.run(args.models, variants, cfg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["blocks", "models"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20, help="blocks: calls per round")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="blocks: batches")
    ap.add_argument("--models", nargs="+", default=["minilm", "bert_base:1", "bert_base:8"])
    ap.add_argument("--f32", action="store_true",
                    help="models: float32 programs, A with PGX_CPU_NATIVE_ATTENTION_F32=0; "
                         "blocks --causal: float32 operands")  # fmt: skip
    ap.add_argument("--causal", action="store_true",
                    help="blocks: GPT-2's causal block, full kernel (A) / causal skipping (B)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.what == "models":
        return models(args)
    (causal_blocks if args.causal else blocks)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
