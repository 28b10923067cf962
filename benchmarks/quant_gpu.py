"""fp16 vs int8 vs fp8 on the `gpu` target: ResNet-50 and BERT-base at batch 32.

    python benchmarks/quant_gpu.py                            # both models, every variant
    python benchmarks/quant_gpu.py --models bert_base --json out.json
    python benchmarks/quant_gpu.py --profile --int8-gemms triton --conv-modes gemm

Every variant compiles the same built-in ONNX model (`pygraphx.models`, random weights) for
`get_target("gpu")` with its inputs on the device (`offload_copy=False`, no host copies timed):

* `fp32`: the float program (the accuracy reference of the others);
* `fp16`: `quantize_fp16`;
* `int8`: `quantize_int8(prog, gpu, samples)` then `quantize_fp16` (int8 products, the rest in
  half, as MIGraphX combines them), once per `PGX_GPU_INT8_GEMM` (`triton`: one Triton kernel
  with the dequantise as epilogue; `cublas`: `torch._int_mm` then the dequantise kernel) and,
  for ResNet-50, per `PGX_GPU_INT8_CONV` mode (`gemm`: every convolution an int8 GEMM;
  `mixed`: 1x1 as int8 GEMMs, the rest cuDNN half; `fp16`: every convolution cuDNN half on
  dequantised values);
* `fp8`: `quantize_fp8(prog, gpu, samples)` then `quantize_fp16`, once per
  `PGX_GPU_FP8_GEMM` (`--fp8-gemms`; `cublas`: `torch._scaled_mm`, the default; `triton`: the
  Triton fp8 GEMM with the next group as its epilogue), the convolutions the device's default
  (`quant_conv.fp8_conv_mode`: Triton fp8 kernels on Hopper, else cuDNN half on dequantised
  values); for ResNet-50 and MobileNetV2 also with each `--fp8-convs` mode set
  (`PGX_GPU_FP8_CONV`: `fp8 conv=cudnn`, `fp8 conv=triton`).

* `int8r`, `fp8r`: the same with `residuals=True` (the residual adds' other operands quantised
  too, `pygraphx/quantize/residual.py`: ResNet's block outputs then live as 8-bit tensors only),
  with the same GEMM / convolution rows as `int8` / `fp8`;
* `--quantise exact reciprocal`: each int8 / fp8 row also with `PGX_GPU_QUANTISE=reciprocal`
  (` q=reciprocal`: the convolutions' quantise by the scale's reciprocal, TensorRT's
  arithmetic; codes one step off the exact ones next to a rounding boundary).

int8 and fp8 quantise only products with a constant operand (`activation_products=False`:
attention's Q.K^T and P.V stay half and run as the fused attention, TensorRT's default);
`--activation-products` quantises those too (each row and the JSON say which).

Each kind is quantised once and saved (`pygraphx.save`); every variant loads and compiles it.
Calibration: `--calib` samples (`model_inputs(name, model, seed=k)`, k = 1..N, each a whole
batch). Timing: every variant is compiled first and kept; then `--blocks` rounds, in each of
which every variant runs in a block of its own (`--warmup` calls, then `--runs` calls each
between two CUDA events, and `--runs` calls queued back to back between one pair of events):
`ms` is the best block's median single-call latency, `ms_queued` the best block's mean time of a
call when calls are queued back to back (device throughput: no host gap between calls). Best of
blocks, each engine in its own block, as the project's benchmarks do (one block of 20 calls
moved the ratios by 3-5% between calls).
Accuracy: the relative RMS error of the first output against `fp32` on the timing input
(seed 0). `fallbacks` lists instructions that ran through numpy (they make a variant slow and
say that a kernel is missing). Figures are comparable within one run of this script.

`--profile`: after timing, each variant runs `--profile-runs` more times uncaptured with the
gpu target's device-event profiling (the one `perf --gpu` uses: every step between two CUDA
events, queued behind a spin kernel so no host time is in them) and prints its device time per
step kind (op name; fused groups with their inner ops) and its `--top` slowest steps.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_vs_peers import time_calls  # noqa: E402  (CUDA-event timing, shared)

import pygraphx  # noqa: E402
from pygraphx.driver.perf import profile_runs  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.passes.fusion_policy import inner_op_names  # noqa: E402
from pygraphx.targets.gpu.quant import FP8_GEMM_ENV, INT8_GEMM_ENV  # noqa: E402
from pygraphx.targets.gpu.quant_conv import FP8_CONV_ENV, INT8_CONV_ENV  # noqa: E402
from pygraphx.targets.gpu.quant_conv_kernels import QUANTISE_ENV  # noqa: E402

CONV_MODELS = {"resnet50", "mobilenetv2"}
#: variant kind -> (quantize_<name>, residuals)
QUANT_KINDS = {"int8": ("int8", False), "int8r": ("int8", True), "fp8": ("fp8", False),
               "fp8r": ("fp8", True)}  # fmt: skip


def rel_rms(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sqrt(np.sum((got - want) ** 2) / np.sum(want**2)))


def quantised_file(
    model_bytes: bytes, kind: str, calib: list[dict], tmp: Path, activation_products: bool
) -> Path:
    """The program of `kind`, quantised once (calibrated on the gpu target) and saved."""
    prog = pygraphx.parse_onnx_buffer(model_bytes)
    if kind in QUANT_KINDS:
        start = time.perf_counter()
        name, residuals = QUANT_KINDS[kind]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quantize = getattr(pygraphx, f"quantize_{name}")
            quantize(
                prog, pygraphx.get_target("gpu"), calib, activation_products=activation_products,
                residuals=residuals,
            )  # fmt: skip
        for w in caught:
            print(f"    warning: {w.message}")
        print(f"    {kind} calibration + quantisation: {time.perf_counter() - start:.1f} s")
    if kind != "fp32":
        pygraphx.quantize_fp16(prog)
    path = tmp / f"{kind}.pgx"
    pygraphx.save(prog, str(path))
    return path


def variant(label: str, path: Path, env: dict[str, str], feeds, args) -> tuple[dict, np.ndarray]:
    """Compile the saved program with `env` set, run it once (graph capture), time it."""
    for key in (INT8_CONV_ENV, INT8_GEMM_ENV, FP8_GEMM_ENV, FP8_CONV_ENV, QUANTISE_ENV):
        os.environ.pop(key, None)
    os.environ.update(env)
    start = time.perf_counter()
    prog = pygraphx.load(str(path))
    prog.compile(pygraphx.get_target("gpu"), offload_copy=False)
    out = np.asarray(prog.run(feeds)[0])
    prepare = time.perf_counter() - start
    ex = prog._executable
    row = {"variant": label, "graph": ex.graph is not None,
           "fallbacks": dict(ex.fallbacks), "prepare_s": prepare, "env": env}  # fmt: skip
    return row, out, prog


def queued_ms(fn, runs: int) -> float:
    """Mean ms of a call when `runs` calls are queued back to back between two CUDA events."""
    fn()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(runs):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / runs


def time_blocks(rows: list[dict], progs: list, feeds, args) -> None:
    """`--blocks` rounds; in each, every variant's own block of calls (see the module doc)."""
    for row in rows:
        row["block_ms"], row["block_ms_queued"] = [], []
    for _ in range(args.blocks):
        for row, prog in zip(rows, progs, strict=True):
            run = lambda p=prog: p.run(feeds)  # noqa: E731
            row["block_ms"].append(statistics.median(time_calls(run, args.warmup, args.runs)))
            row["block_ms_queued"].append(queued_ms(run, args.runs))
    for row in rows:
        row["ms"], row["ms_queued"] = min(row["block_ms"]), min(row["block_ms_queued"])


QUANT_PRODUCTS = ("quant_dot", "quant_convolution")


def step_kind(ins, timed=lambda ins: True) -> str:
    """An instruction's op name; a fused group's with its inner ops; a dequantise that is its
    product's epilogue (the product's step is timed under it) as `product+dequantise`, and a
    group that is the GEMM's epilogue too (its dequantise has no time: `timed`) as
    `product+dequantise+group` (an fp8 product's group, which starts with its dequantise:
    `product+group`)."""
    source = ins.inputs[0].op.name if ins.inputs else ""
    if ins.op.name == "dequantizelinear" and source in QUANT_PRODUCTS:
        return f"{source}+dequantise"
    if not ins.module_inputs:
        return ins.op.name
    kind = f"{ins.op.name}[{','.join(inner_op_names(ins))}]"
    for x in ins.inputs:
        if (
            x.op.name == "dequantizelinear"
            and not timed(x)
            and x.inputs[0].op.name in QUANT_PRODUCTS
        ):
            return f"{x.inputs[0].op.name}+dequantise+{kind}"
        if x.op.name in QUANT_PRODUCTS and not timed(x):  # an fp8 GEMM with the group
            return f"{x.op.name}+{kind}"
    return kind


def device_profile(prog, feeds, runs: int, top: int) -> dict[str, Any]:
    """Per-run device ms of every step kind and of the `top` slowest steps (`profile_runs`:
    the gpu target's device-event timing of each step, uncaptured)."""
    prof = profile_runs(prog, feeds, runs)
    steps = []

    def timed(ins) -> bool:
        return prof.average(ins) > 0

    for ins in prof.order:
        ms = prof.average(ins) * 1e3
        if ms > 0:
            kind = step_kind(ins, timed)
            source = ins.inputs[0] if kind.endswith("+dequantise") else ins
            ins_lens = " ".join(str(list(x.shape.lens())) for x in source.inputs)
            shape = f"{ins.shape.type()}{list(ins.shape.lens())} <- {ins_lens}"
            steps.append({"kind": kind, "ms": ms, "shape": shape})
    kinds: dict[str, list[float]] = {}
    for step in steps:
        kinds.setdefault(step["kind"], []).append(step["ms"])
    by_kind = sorted(
        ({"kind": k, "ms": sum(v), "count": len(v)} for k, v in kinds.items()),
        key=lambda r: r["ms"],
        reverse=True,
    )
    total = sum(s["ms"] for s in steps)
    print(f"    device time of the steps: {total:.3f} ms per run ({runs} profiled runs)")
    for r in by_kind:
        share = 100 * r["ms"] / total if total > 0 else 0.0
        print(f"      {r['ms']:8.3f} ms {share:5.1f}%  x{r['count']:<4d} {r['kind']}")
    print(f"    top {top} steps:")
    for s in sorted(steps, key=lambda r: r["ms"], reverse=True)[:top]:
        print(f"      {s['ms']:8.3f} ms  {s['kind']}  {s['shape']}")
    return {"total_ms": total, "by_kind": by_kind, "steps": steps}


def plans(
    name: str,
    gemms=("triton", "cublas"),
    modes=("gemm", "mixed", "fp16"),
    fp8_gemms=("triton",),
    fp8_convs=("cudnn", "triton"),
) -> list[tuple[str, str, dict[str, str]]]:
    """(label, kind, environment) of every variant of model `name` (int8 rows for the GEMM
    choices `gemms` and, with convolutions, the convolution modes `modes`; fp8 rows for the
    fp8 GEMM choices `fp8_gemms` and, with convolutions, the fp8 convolution modes
    `fp8_convs`)."""
    rows = [("fp32", "fp32", {}), ("fp16", "fp16", {})]
    for int8 in ("int8", "int8r"):
        if name in CONV_MODELS:
            for mode in modes:
                for gemm in gemms if mode != "fp16" else gemms[:1]:
                    env = {INT8_CONV_ENV: mode, INT8_GEMM_ENV: gemm}
                    rows.append((f"{int8} conv={mode} gemm={gemm}", int8, env))
        else:
            rows += [(f"{int8} gemm={g}", int8, {INT8_GEMM_ENV: g}) for g in gemms]
    for fp8 in ("fp8", "fp8r"):
        rows += [(f"{fp8} gemm={g}", fp8, {FP8_GEMM_ENV: g}) for g in fp8_gemms]
        if name in CONV_MODELS:
            rows += [(f"{fp8} conv={m}", fp8, {FP8_CONV_ENV: m}) for m in fp8_convs]
    return rows


def with_quantise(rows: list, modes=("exact",)) -> list[tuple[str, str, dict[str, str]]]:
    """`rows` with each int8 / fp8 row once per `PGX_GPU_QUANTISE` mode (`modes`; a row of
    another mode than `exact` is labelled ` q=<mode>`)."""
    out = []
    for label, kind, env in rows:
        if kind not in QUANT_KINDS:
            out.append((label, kind, env))
            continue
        for mode in modes:
            tag = "" if mode == "exact" else f" q={mode}"
            out.append((label + tag, kind, {**env, QUANTISE_ENV: mode}))
    return out


def bench_model(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    what = "all products" if args.activation_products else "products with constant weights"
    print(f"{name} (batch {args.batch}; int8/fp8 quantise {what}):", flush=True)
    model = get_model(name, batch=args.batch, seq_len=args.seq_len)
    model_bytes = model.SerializeToString()
    host = model_inputs(name, model, seed=0)
    feeds = {k: torch.from_numpy(v).cuda() for k, v in host.items()}
    calib = [model_inputs(name, model, seed=k) for k in range(1, args.calib + 1)]
    files: dict[str, Path] = {}
    rows, progs, want = [], [], None
    rows_of = plans(
        name, args.int8_gemms, args.conv_modes, args.fp8_gemms,
        [] if args.no_fp8_triton_conv else args.fp8_convs,
    )  # fmt: skip
    for label, kind, env in with_quantise(rows_of, args.quantise):
        if kind not in args.variants:
            continue
        if kind not in files:
            files[kind] = quantised_file(model_bytes, kind, calib, tmp, args.activation_products)
        row, out, prog = variant(label, files[kind], env, feeds, args)
        if kind in QUANT_KINDS:
            row["activation_products"] = args.activation_products
            row["residuals"] = QUANT_KINDS[kind][1]
        if kind == "fp32":
            want = out
        row["rel_rms_vs_fp32"] = None if want is None else rel_rms(out, want)
        print(f"  compiled {label} (prepare {row['prepare_s']:.1f} s)", flush=True)
        rows.append(row)
        progs.append(prog)
    time_blocks(rows, progs, feeds, args)
    for row, prog in zip(rows, progs, strict=True):
        if args.profile:
            print(f"  {row['variant']}:")
            row["profile"] = device_profile(prog, feeds, args.profile_runs, args.top)
    base = next((r["ms"] for r in rows if r["variant"] == "fp16"), None)
    for row in rows:
        ratio = f"  /fp16 {row['ms'] / base:.3f}" if base else ""
        print(
            f"  {row['variant']:30s} {row['ms']:8.3f} ms (blocks {row['block_ms']}){ratio}"
            f"  queued {row['ms_queued']:.3f} ms  rel rms {row['rel_rms_vs_fp32']}"
            f"  graph={row['graph']} fallbacks={row['fallbacks']} prepare {row['prepare_s']:.1f}s",
            flush=True,
        )
    del progs
    gc.collect()  # the model's programs and their device memory go before the next model
    torch.cuda.empty_cache()
    return {"model": name, "batch": args.batch, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet50", "bert_base"])
    ap.add_argument(
        "--variants", nargs="+", default=["fp32", "fp16", "int8", "fp8"],
        choices=["fp32", "fp16", *QUANT_KINDS],
    )  # fmt: skip
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--calib", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument(
        "--no-fp8-triton-conv", action="store_true",
        help="leave out the `--fp8-convs` rows of convolutional models",
    )  # fmt: skip
    ap.add_argument(
        "--fp8-convs", nargs="*", default=["cudnn", "triton"], choices=["cudnn", "triton"],
        help="fp8 rows of convolutional models with PGX_GPU_FP8_CONV set to each",
    )  # fmt: skip
    ap.add_argument("--blocks", type=int, default=2, help="rounds of per-variant blocks; best")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--int8-gemms", nargs="+", default=["triton", "cublas"])
    ap.add_argument("--conv-modes", nargs="+", default=["gemm", "mixed", "fp16"])
    ap.add_argument("--fp8-gemms", nargs="+", default=["cublas", "triton"])
    ap.add_argument(
        "--activation-products", action="store_true",
        help="quantise products of two activations too (attention's; default: they stay half)",
    )  # fmt: skip
    ap.add_argument(
        "--quantise", nargs="+", default=["exact"], choices=["exact", "reciprocal"],
        help="int8 / fp8 rows once per PGX_GPU_QUANTISE mode (the convolutions' quantise)",
    )  # fmt: skip
    ap.add_argument("--profile", action="store_true", help="device time per step kind (see above)")
    ap.add_argument("--profile-runs", type=int, default=3)
    ap.add_argument("--top", type=int, default=15, help="slowest steps printed with --profile")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("quant_gpu.py needs a CUDA/ROCm GPU", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        results = [bench_model(m, args, Path(tmp)) for m in args.models]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
