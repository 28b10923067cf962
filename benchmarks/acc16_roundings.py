"""One bf16 rounding at a time: a float32 program with a single class of values rounded to bf16
(helper acc16, issue 10), its error against ORT float32 beside our bf16 program's and OpenVINO's.

    python benchmarks/acc16_roundings.py --models minilm --seeds 10

Each point is a float32 program (simplified as `quantize_bf16` does, then compiled float32)
where only these values are rounded to bf16 and back (`convert` to bf16 then float32 inserted
after them; weights: the literal's values rounded), everything else float32:

  in_qkv / in_up: the layer norm output as the QKV / FFN-up product reads it (its input
      rounding; the residual stream reads it unrounded);
  w_qkv / w_out / w_up / w_down: those products' weights (`acc16_roles.role_of`);
  qkv_out: the QKV product's result (with bias), read by the attention; q / k / v: one third;
  scores: the attention's scaled scores (the scale multiply's result); probs: softmax's result;
  ctx: the attention's output (PV product, the out-projection's input);
  up_out: the FFN-up product's result before GELU (bias included); gelu: GELU's result (the
      FFN-down product's input); out / down: the out-projection's / FFN-down's result (with bias).

`point@i` rounds the i-th occurrence only (layer i of a transformer), `point@i:j` layers i to
j - 1; `a+b` rounds both (`in_qkv+w_qkv+q+k+v+probs+ctx+w_out+in_up+w_up+gelu+w_down`: what our
bf16 program rounds, emulated in float32).

The sum of the squares of single-point errors is about the square of the whole (the roundings
are independent); the biggest terms are where a float32 value would buy the most.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from benchmarks.acc16_roles import role_of  # noqa: E402
from benchmarks.bf16acc14_precisions import load  # noqa: E402
from benchmarks.cpu_engines import make_openvino, make_ort  # noqa: E402
from benchmarks.cpu_vs_peers import relative_error  # noqa: E402
from pygraphx.ir.argument import Literal  # noqa: E402
from pygraphx.ops.base import ViewOp  # noqa: E402
from pygraphx.ops.literal_views import view_source  # noqa: E402
from pygraphx.ops.pointwise import Convert  # noqa: E402
from pygraphx.passes.manager import run_passes  # noqa: E402
from pygraphx.passes.pipeline import optimize_passes  # noqa: E402
from pygraphx.quantize.graph_tail import is_constant_view  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402

tf = importlib.import_module("pygraphx.quantize.truncate_float")
POINTS = ("in_qkv", "w_qkv", "qkv_out", "scores", "probs", "ctx", "w_out", "out",
          "in_up", "w_up", "up_out", "gelu", "w_down", "down")  # fmt: skip


W_ROLE = {"w_qkv": "qkv", "w_out": "attn_out", "w_up": "ffn_up", "w_down": "ffn_down"}
IN_ROLE = {"in_qkv": "qkv", "in_up": "ffn_up"}
OUT_ROLE = {"qkv_out": "qkv", "out": "attn_out", "up_out": "ffn_up", "down": "ffn_down"}


def points_of(main: Any, point: str) -> list[Any]:
    """The values of `point`: literals (weights), (dot, 0) (a product's first input, rounded
    for that product only) or instructions (rounded for every user)."""
    found: list[Any] = []
    for ins in main.instructions:
        role = role_of(ins)
        if role is not None and role == W_ROLE.get(point):
            found.append(view_source(ins.inputs[1]))
        elif role is not None and role == IN_ROLE.get(point):
            found.append((ins, 0))
        elif role is not None and role == OUT_ROLE.get(point):
            (user,) = ins.outputs  # the bias add
            found.append(user)
        elif point in ("q", "k", "v") and role == "qkv":
            (user,) = ins.outputs
            for sl in user.outputs:
                if _reads_as(sl) == point:
                    found.append(sl)
        elif point == "scores" and role == "scale":
            found.append(ins)
        elif point == "probs" and ins.op.name == "softmax":
            found.append(ins)
        elif point == "ctx" and role == "pv":
            found.append(ins)
        elif point == "gelu" and ins.op.name == "gelu":
            found.append(ins)
    return found


def _reads_as(x: Any) -> str | None:
    """"q" / "k" / "v": which attention operand the view chain from `x` becomes."""
    todo = [x]
    while todo:
        y = todo.pop()
        for u in y.outputs:
            if u.op.name == "dot":
                r = role_of(u)
                i = u.inputs.index(y)
                return {("qk", 0): "q", ("qk", 1): "k", ("pv", 1): "v"}.get((r, i))
            if isinstance(u.op, ViewOp) or u.op.name == "contiguous":
                todo.append(u)
    return None


def round_after(main: Any, ins: Any, only: Any = None) -> None:
    """Users of `ins` (or `only`) read `float(bf16(ins))`."""
    nxt = main.instructions[main.position(ins) + 1]
    low = main.insert_instruction(nxt, Convert(target_type="bf16_type"), [ins])
    back = main.insert_instruction(nxt, Convert(target_type="float_type"), [low])
    users = [u for u in ins.outputs if u is not low and (only is None or u is only)]
    for user in users:
        user.inputs = [back if x is ins else x for x in user.inputs]
        back.outputs.append(user)
    ins.outputs = [u for u in ins.outputs if u not in users]


def program(model: Any, threads: int, point: str | None) -> tuple[Any, int]:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    if point == "bf16":
        pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=threads))
        return prog, 0
    run_passes(prog, optimize_passes(fuse=False, plan_memory=False))
    main = prog.get_main_module()
    found = []
    for part in point.split("+") if point else []:
        name, _, at = part.partition("@")  # `point@i`: layer i only; `point@i:j`: i to j - 1
        these = points_of(main, name)
        if ":" in at:
            lo, hi = at.split(":")
            these = these[int(lo) : int(hi)]
        elif at:
            these = these[int(at) :][:1]
        found += these
    for ins in found:
        if isinstance(ins, tuple):
            dot, i = ins
            round_after(main, dot.inputs[i], only=dot)
        elif ins.is_literal():
            arr = ins.get_literal().array
            low = arr.astype(ml_dtypes.bfloat16).astype(np.float32)
            main.replace_op(ins, type(ins.op)(Literal(low)))
        else:
            round_after(main, ins)
    prog.compile(CpuTarget(threads=threads))
    return prog, len(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["minilm"])
    parser.add_argument("--points", nargs="+", default=list(POINTS))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args(argv)
    for name in args.models:
        model, inputs = load(name, args.batch)
        ort, _ = make_ort(model, args.threads)
        ov, _, ov_precision = make_openvino(model, args.threads, None)
        engines: dict[str, Callable] = {}
        for point in ["bf16", "f32", *args.points]:
            prog, n = program(model, args.threads, None if point == "f32" else point)
            print(f"{name}: {point}: {n} values rounded", flush=True)
            engines[point] = lambda f, p=prog: [np.asarray(a) for a in p.run(f)]
        engines["ov_bf16"] = ov
        rows = collections.defaultdict(list)
        for seed in range(args.seeds):
            feeds = inputs(seed)
            want = ort(feeds)
            for key, fn in engines.items():
                rows[key].append(relative_error(fn(feeds), want))
        print(f"{name} ({ov_precision}) table input (seed 0) | mean over {args.seeds} seeds:")
        for key, v in rows.items():
            print(f"  {key:8s} {v[0]:.4e} | {statistics.mean(v):.4e}", flush=True)
        singles = [k for k in rows if k not in ("bf16", "f32", "ov_bf16")]
        quad = np.sqrt(sum(statistics.mean(rows[k]) ** 2 for k in singles))
        print(f"  quadrature sum of the single points (mean): {quad:.4e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
