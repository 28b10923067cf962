"""attn15: the native bf16 attention kernel normalising a row by the sum of its *rounded*
weights (this tree, `PGX_CPU_NATIVE_ATTENTION_ROUNDED_SUM` on) against main's kernel (built from
git's `BASE` revision of attention.c: the sum of the unrounded exponentials), in one process.

    PYTHONPATH=. python benchmarks/attn15_ab.py blocks --threads 1 --rounds 12
        # blocks (MiniLM b8, BERT-base b1 / b8, GPT-2 b1 causal): time per call, median over
        # rounds, old / new alternating (old new in even rounds, new old in odd ones); thread
        # CPU time at one thread, wall at more
    PYTHONPATH=. python benchmarks/attn15_ab.py models --threads 1 --rounds 16 --repeat 3 \
        --models minilm bert_base
        # whole bf16 programs (quantize_bf16): main's kernel / this tree's, time per run
        # (`benchmarks/ab_harness.py`, the one harness: its table, then new/main)
    PYTHONPATH=. python benchmarks/attn15_ab.py errors --models minilm bert_base gpt2 --seeds 6
        # relative RMS error against ORT float32 per output (`cpu_vs_peers.relative_error` is
        # the worst output's): main's kernel, this tree's with the switch off (its first
        # version's numbers), this tree's, `PGX_CPU_NATIVE_ATTENTION=0` (oneDNN's route) and,
        # with `--openvino`, OpenVINO's default precision (bf16 on this machine)

Main's kernel reads the same parameter array; this tree's first version is a build with
`-DPGX_ATTN_RSUM=0` (the switch off), whose object code is main's. Inputs as `bf16acc14_precisions.py`: MiniLM seed 0 the zoo's sentences, seed k > 0
random token ids; the built-in models' `model_inputs` with seeds 0, 1, ...
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import native_attention as na  # noqa: E402

BASE = "82665c0"  # main at the session's start
SOURCE = "pygraphx/targets/native/kernels/attention.c"
BLOCKS = {  # name: (batch, heads, sequence, head width, padding mask, causal)
    "minilm_b8": (8, 12, 128, 32, True, False),
    "bert_b1": (1, 12, 128, 64, True, False),
    "bert_b8": (8, 12, 128, 64, True, False),
    "gpt2_b1_causal": (1, 12, 128, 64, False, True),
}


def old_kernel() -> Callable:
    """Main's bf16 kernel (git `BASE`), bound as `native_attention.kernel` binds this tree's."""
    src = subprocess.run(["git", "show", f"{BASE}:{SOURCE}"], check=True, capture_output=True,
                         text=True).stdout  # fmt: skip
    lib = native.load_source("attention_before_attn15", src)
    assert lib.pgx_attention_params() == len(na.FIELDS)
    fn = lib.pgx_attention_bf16
    fn.restype, fn.argtypes = na.c_int, [na.c_void_p, na.c_double] + [na.c_void_p] * 5
    fn.scratch_bytes = lib.pgx_attention_scratch
    fn.scratch_bytes.restype = na.c_int64
    fn.scratch_bytes.argtypes = [na.c_void_p, na.c_int]
    return fn


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def blocks(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    engines = {"old": old_kernel(), "new": na.kernel(torch.bfloat16)}
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"threads {args.threads}, load {loadavg()}")
    for name in args.blocks:
        b, h, s, d, masked, causal = BLOCKS[name]
        gen = torch.Generator().manual_seed(0)
        qkv = torch.randn(b, s, 3, h, d, generator=gen).bfloat16()
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        kt = k.transpose(-1, -2)
        mask = None
        if masked:
            mask = torch.zeros(b, 1, 1, s)
            mask[..., -9:] = -1e4
        extra = dict(causal=0, rows=na.CAUSAL_ROWS) if causal else {}
        plans = {key: na.Plan(fn, d**-0.5, q, kt, v, mask, args.threads, **extra)
                 for key, fn in engines.items()}  # fmt: skip
        calls = args.calls or (20 if b == 1 else 4)
        times: dict[str, list[float]] = {key: [] for key in plans}
        for r in range(args.rounds):
            for key in list(plans) if r % 2 == 0 else list(plans)[::-1]:
                plan = plans[key]
                plan.run(q, kt, v, mask)
                t0 = clock()
                for _ in range(calls):
                    plan.run(q, kt, v, mask)
                times[key].append((clock() - t0) / calls * 1e6)
        old, new = (statistics.median(times[k]) for k in ("old", "new"))
        print(f"{name}: old {old:.1f} us (best {min(times['old']):.1f}), new {new:.1f} us "
              f"(best {min(times['new']):.1f}), new/old {new / old:.3f}", flush=True)  # fmt: skip
    print(f"load at the end {loadavg()}")


@contextlib.contextmanager
def engine(key: str, old: Callable) -> Iterator[None]:
    """The lowering's kernel and switches for engine `key` while a program compiles."""
    saved = os.environ.copy()
    kernel = na.kernel
    try:
        if key == "main":
            na.kernel = lambda dtype=torch.bfloat16, extra_flags=(), rsum=None: (  # type: ignore
                old if dtype == torch.bfloat16 else kernel(dtype, extra_flags, rsum))
        elif key == "first":
            os.environ[na.ROUNDED_SUM_ENV] = "0"
        elif key == "onednn":
            os.environ[na.ENV] = "0"
        yield
    finally:
        na.kernel = kernel  # type: ignore
        os.environ.clear()
        os.environ.update(saved)


def program(model, threads: int, key: str, old: Callable):
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog)
    with engine(key, old):
        prog.compile(CpuTarget(threads=threads))
    return prog


def models(args: argparse.Namespace) -> int:
    """Whole bf16 programs: `benchmarks/ab_harness.py` over the engines (an engine named twice,
    `--engines main new main new`, gets a program each: the spread between two programs of one
    engine is the noise floor of the comparison); then new/main, the mean over programs."""
    import onnx

    from benchmarks import ab_harness as ab
    from benchmarks.bf16acc14_precisions import load

    old = old_kernel()

    def variant(i: int, key: str) -> ab.Variant:
        def build(case: ab.Case, threads: int):
            return program(onnx.load_from_string(case.data), threads, key, old)

        return ab.Variant(f"{key}{i}", bf16=True, build=build, label=f"{key}'s kernel")

    variants = [variant(i, key) for i, key in enumerate(args.engines)]
    cfg = ab.Config(threads=args.threads, rounds=args.rounds, runs=args.repeat, settle=1)
    torch.set_num_threads(args.threads)
    # (as `ab.run` does: the run-time thread controls at 0 where unset, said)
    print("# run-time thread adaptation:", ab.describe_adaptation(ab.fix_adaptation()))
    rc = 0
    for name in args.models:
        model, inputs = load(name, 1)
        res = ab.ab_case(ab.Case(name, model.SerializeToString(), inputs(0)), variants, cfg)
        rc |= not res["ok"]
        med = {k: v["median_ms"] for k, v in res["variants"].items()}
        mean = {e: statistics.mean(v for k, v in med.items() if k.rstrip("0123456789") == e)
                for e in set(args.engines)}  # fmt: skip
        if {"new", "main"} <= set(mean):
            print(f"{name}: new/main {mean['new'] / mean['main']:.3f} (medians, mean over "
                  f"programs); load {loadavg()}", flush=True)  # fmt: skip
    return int(rc)


def errors(args: argparse.Namespace) -> None:
    from benchmarks.bf16acc14_precisions import load
    from benchmarks.cpu_engines import make_openvino, make_ort

    old = old_kernel()
    keys = ("main", "first", "new", "onednn")
    for name in args.models:
        model, inputs = load(name, 1)
        ort, _ = make_ort(model, args.threads)
        progs: dict[str, Callable] = {
            key: program(model, args.threads, key, old).run for key in keys
        }
        if args.openvino:
            progs["ov_bf16"] = make_openvino(model, args.threads, None)[0]
        rows: dict[str, list[list[float]]] = {key: [] for key in progs}
        for seed in range(args.seeds):
            feeds = inputs(seed)
            want = ort(feeds)
            line = []
            for key, prog in progs.items():
                got = [np.asarray(a, dtype=np.float64) for a in prog(feeds)]
                errs = [float(np.linalg.norm(g - w) / np.linalg.norm(w))
                        for g, w in zip(got, (np.asarray(w, np.float64) for w in want),
                                        strict=True)]  # fmt: skip
                rows[key].append(errs)
                line.append(f"{key} " + "/".join(f"{e:.4e}" for e in errs))
            print(f"{name} seed {seed}: " + ", ".join(line), flush=True)
        shapes = [tuple(np.asarray(w).shape) for w in want]
        for i, shape in enumerate(shapes):
            mean = ", ".join(f"{k} {statistics.mean(r[i] for r in v):.4e}" for k, v in rows.items())
            print(f"{name} output {i} {shape} mean over {args.seeds} seeds: {mean}")
        worst = ", ".join(f"{k} {statistics.mean(max(r) for r in v):.4e}"
                          for k, v in rows.items())  # fmt: skip
        print(f"{name} worst output (the tables' figure), mean: {worst}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("blocks", "models", "errors"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--calls", type=int, default=0, help="blocks: calls a round (0: 20 / 4)")
    ap.add_argument("--repeat", type=int, default=3, help="models: runs a round")
    ap.add_argument("--blocks", nargs="+", default=list(BLOCKS), choices=list(BLOCKS))
    ap.add_argument("--models", nargs="+", default=["minilm", "bert_base"])
    ap.add_argument("--engines", nargs="+", default=["main", "new"], choices=["main", "new"],
                    help="models: the programs, in compile order (an engine may repeat)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--openvino", action="store_true", help="errors: OpenVINO's default (bf16)")
    args = ap.parse_args(argv)
    return {"blocks": blocks, "models": models, "errors": errors}[args.what](args) or 0


if __name__ == "__main__":
    raise SystemExit(main())
