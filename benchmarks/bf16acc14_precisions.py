"""bf16 error against OpenVINO's (issue 10): where OpenVINO keeps float32, what our bf16 program
rounds, the error of each choice and what it costs (helper bf16acc14).

    python benchmarks/bf16acc14_precisions.py dump --models resnet50 minilm
        # OpenVINO's runtime model (`compiled.get_runtime_model()`: each node's layerType,
        # runtimePrecision, outputPrecisions) counted by kind, beside our bf16 program's
        # instructions counted by (operator, type), and which constants feed which product
    python benchmarks/bf16acc14_precisions.py errors --models resnet50 minilm --seeds 3
        # relative RMS error against ORT float32 on several inputs: our bf16 program with the
        # products' biases rounded to bf16 in the kernels (old) and kept float32 (new,
        # `quantize.wide_constants`), OpenVINO bf16, and float32 programs that round one kind of
        # constant only (ablation: weights / biases / the rest)
    python benchmarks/bf16acc14_precisions.py time --models resnet50 --rounds 6 --repeat 8
        # latency A/B in one process: old / new / OpenVINO bf16 blocks alternating, the order
        # reversed every round; median of each engine's blocks and its best block

Every engine uses `--threads` threads (default 2). Inputs: the built-in models' `model_inputs`
with seeds 0, 1, ...; MiniLM (the zoo's all-MiniLM-L6-v2, 8 x 128): seed 0 is the zoo's
sentences, seed k > 0 random token ids in the same shape and mask; the zoo's image models
(`benchmarks/zoo.py`, full size): seed 0 the zoo's inputs, seed k > 0 standard normal ones.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from benchmarks.cpu_engines import make_openvino, make_ort  # noqa: E402
from benchmarks.cpu_vs_peers import relative_error  # noqa: E402
from pygraphx.ir.argument import Literal  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.ops.base import ViewOp  # noqa: E402
from pygraphx.passes.manager import run_passes  # noqa: E402
from pygraphx.passes.pipeline import optimize_passes  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402

wide_constants = importlib.import_module("pygraphx.quantize.wide_constants")
PRODUCTS = ("convolution", "dot")
Feeds = dict[str, np.ndarray]


def load(name: str, batch: int | str) -> tuple[onnx.ModelProto, Callable[[int], Feeds]]:
    """The model and a seed -> inputs function (a zoo model: its own batch, `batch` unused)."""
    from benchmarks.zoo import ZOO_NAMES, zoo_model

    if name == "minilm":
        path, feeds0 = zoo_model("minilm", "full")

        def minilm_inputs(seed: int) -> Feeds:
            if seed == 0:
                return feeds0
            rng = np.random.default_rng(seed)
            feeds = dict(feeds0)
            ids = rng.integers(1000, 30000, feeds["input_ids"].shape, dtype=np.int64)
            ids[:, 0] = 101  # [CLS]
            feeds["input_ids"] = np.where(feeds["attention_mask"] > 0, ids, 0)
            return feeds

        return onnx.load(str(path)), minilm_inputs
    if name in ZOO_NAMES:  # images: seed 0 the zoo's inputs, seed k > 0 standard normal ones
        path, zoo_feeds = zoo_model(name, "full")

        def zoo_inputs(seed: int) -> Feeds:
            rng = np.random.default_rng(seed)
            return zoo_feeds if seed == 0 else {
                k: rng.standard_normal(v.shape, dtype=np.float32) for k, v in zoo_feeds.items()
            }

        return onnx.load(str(path)), zoo_inputs
    model = get_model(name, batch=batch, seq_len=128)
    return model, lambda seed: model_inputs(name, model, seed=seed)


def _zoo(name: str) -> bool:
    from benchmarks.zoo import ZOO_NAMES

    return name in ZOO_NAMES


def bf16_program(model: onnx.ModelProto, threads: int, wide: bool) -> Any:
    """Our bf16 program, its products' biases kept float32 in the kernels (`wide`) or not."""
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    wide_constants.KEEP_WIDE = wide
    try:
        pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=threads))
    finally:
        wide_constants.KEEP_WIDE = None
    return prog


def _ends(ins: Any) -> list[Any]:
    """The users of `ins`, looking through views."""
    out = []
    for user in ins.outputs:
        out += _ends(user) if isinstance(user.op, ViewOp) else [user]
    return out


def _from_product(x: Any) -> bool:
    while isinstance(x.op, ViewOp) and x.inputs:
        x = x.inputs[0]
    return x.op.name in PRODUCTS


def constant_kind(ins: Any) -> str:
    """"weight" (an operand of a product), "bias" (added to a product's result) or "other"."""
    ends = _ends(ins)
    if any(u.op.name in PRODUCTS for u in ends):
        return "weight"
    if any(u.op.name == "add" and any(_from_product(x) for x in u.inputs) for u in ends):
        return "bias"
    return "other"


def rounded_f32_program(model: onnx.ModelProto, threads: int, kind: str) -> Any:
    """A float32 program whose constants of `kind` only are rounded to bf16 (ablation)."""
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    run_passes(prog, optimize_passes(fuse=False, plan_memory=False))
    main = prog.get_main_module()
    for ins in list(main.instructions):
        if not ins.is_literal() or ins.get_literal().array.dtype != np.float32:
            continue
        if constant_kind(ins) == kind:
            arr = ins.get_literal().array
            low = arr.astype(ml_dtypes.bfloat16).astype(np.float32)
            main.replace_op(ins, type(ins.op)(Literal(low)))
    prog.compile(CpuTarget(threads=threads))
    return prog


def _runner(prog: Any) -> Callable[[Feeds], list[np.ndarray]]:
    return lambda feeds: [np.asarray(a) for a in prog.run(feeds)]


def errors(args: argparse.Namespace) -> None:
    for name in args.models:
        for batch in args.batches if not _zoo(name) else ["zoo"]:
            model, inputs = load(name, batch)
            ort, _ = make_ort(model, args.threads)
            ov, _, ov_precision = make_openvino(model, args.threads, None)
            engines = {
                "old": _runner(bf16_program(model, args.threads, wide=False)),
                "new": _runner(bf16_program(model, args.threads, wide=True)),
                "ov_bf16": ov,
            }
            if args.ablation:
                for kind in ("weight", "bias", "other"):
                    engines[f"f32_round_{kind}"] = _runner(
                        rounded_f32_program(model, args.threads, kind)
                    )
            rows = collections.defaultdict(list)
            for seed in range(args.seeds):
                feeds = inputs(seed)
                want = ort(feeds)
                line = []
                for key, fn in engines.items():
                    err = relative_error(fn(feeds), want)
                    rows[key].append(err)
                    line.append(f"{key} {err:.3e}")
                print(f"{name} b{batch} seed {seed}: " + ", ".join(line), flush=True)
            mean = ", ".join(f"{k} {statistics.mean(v):.3e}" for k, v in rows.items())
            print(f"{name} b{batch} mean over {args.seeds} seeds ({ov_precision}): {mean}")


def _block(fn: Callable[[], Any], repeat: int, cpu: bool) -> float:
    """The median wall time of `repeat` runs, or (`cpu`) their mean process CPU time, in ms."""
    clock = time.process_time if cpu else time.perf_counter
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return (statistics.mean(times) if cpu else statistics.median(times)) * 1e3


def timing(args: argparse.Namespace) -> None:
    for name in args.models:
        for batch in args.batches if not _zoo(name) else ["zoo"]:
            model, inputs = load(name, batch)
            feeds = inputs(0)
            old = bf16_program(model, args.threads, wide=False)
            new = bf16_program(model, args.threads, wide=True)
            engines = {"old": lambda: old.run(feeds), "new": lambda: new.run(feeds)}
            if not args.no_openvino:
                ov, _, _ = make_openvino(model, args.threads, None)
                engines["ov_bf16"] = lambda: ov(feeds)
            for fn in engines.values():
                for _ in range(args.warmup):
                    fn()
            blocks = collections.defaultdict(list)
            for r in range(args.rounds):
                order = list(engines) if r % 2 == 0 else list(reversed(engines))
                for key in order:
                    blocks[key].append(_block(engines[key], args.repeat, args.cpu))
            with open("/proc/loadavg") as f:
                load_now = f.read().split()[0]
            figures = ", ".join(
                f"{k} {statistics.median(v):.2f} (best {min(v):.2f})" for k, v in blocks.items()
            )
            clock = "process CPU" if args.cpu else "wall"
            print(f"{name} b{batch} t{args.threads} {clock} ms, median of blocks (best block): {figures}; "
                  f"new/old {statistics.median(blocks['new']) / statistics.median(blocks['old']):.3f}"
                  + (f", new/OV {statistics.median(blocks['new']) / statistics.median(blocks['ov_bf16']):.3f}"
                     if "ov_bf16" in blocks else "")
                  + f"; loadavg at the end {load_now}", flush=True)  # fmt: skip


def ov_runtime(model: onnx.ModelProto, threads: int) -> collections.Counter:
    import openvino as ov

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model.SerializeToString())
        compiled = ov.Core().compile_model(
            str(path), "CPU", {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
        )
    counts: collections.Counter = collections.Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()

        def get(key: str, info: Any = info) -> str:
            return info[key].astype(str) if key in info else "?"

        if get("layerType") in ("Const", "Input", "Output"):
            continue
        counts[(get("layerType"), get("runtimePrecision"), get("outputPrecisions"))] += 1
    return counts


def dump(args: argparse.Namespace) -> None:
    for name in args.models:
        model, _ = load(name, args.batches[0])
        print(f"## {name}: OpenVINO's runtime model (layer type, runtime precision, output)")
        for (kind, runtime, out), n in sorted(ov_runtime(model, args.threads).items()):
            print(f"  {n:4d} x {kind:16s} {runtime:6s} -> {out}")
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        pygraphx.quantize_bf16(prog)
        counts: collections.Counter = collections.Counter()
        consts: collections.Counter = collections.Counter()
        for ins in prog.get_main_module().instructions:
            if ins.is_literal():
                if ins.shape.type() in ("float_type", "bf16_type"):
                    wide = isinstance(ins.get_literal(), wide_constants.RoundedLiteral)
                    key = (constant_kind(ins), ins.shape.type(), "float32 kept" if wide else "")
                    consts[key] += 1
            elif not isinstance(ins.op, ViewOp) and not ins.is_param() and not ins.is_return():
                counts[(ins.op.name, ins.shape.type())] += 1
        print(f"## {name}: our bf16 program (quantize_bf16, before compile): operator, type")
        for (op, typ), n in sorted(counts.items()):
            print(f"  {n:4d} x {op:16s} {typ}")
        print(f"## {name}: our constants: role, type, float32 value kept for the kernels")
        for (kind, typ, wide), n in sorted(consts.items()):
            print(f"  {n:4d} x {kind:7s} {typ:10s} {wide}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("dump", "errors", "time"))
    parser.add_argument("--models", nargs="+", default=["resnet50", "minilm"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--ablation", action="store_true", help="errors: the float32 ablations")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="time: process CPU time, not wall")
    parser.add_argument("--no-openvino", action="store_true", help="time: old / new only")
    args = parser.parse_args(argv)
    {"dump": dump, "errors": errors, "time": timing}[args.what](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
