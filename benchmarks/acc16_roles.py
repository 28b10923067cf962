"""Where a transformer's bf16 error comes from, by role (helper acc16, issue 10).

    python benchmarks/acc16_roles.py --models minilm --seeds 10 \
        --roles none qkv qk scale pv attn_out ffn_up gelu ffn_down
        # relative RMS error against ORT float32 (the table's `relative_error`) of our bf16
        # program with one class of instruction kept float32 (the rest as `quantize_bf16`
        # makes it; what follows a kept instruction follows the data flow), and of OpenVINO's
        # bf16, on seed 0 (the table's input) and seeds 1.. (`bf16acc14_precisions.load`)

Roles (classified on the simplified float32 program, before truncation):
  qkv / attn_out / ffn_up / ffn_down: the products with a constant weight, by the weight's shape
      (out = 3 x in; out = in; out > in; out < in), their bias and activation following them;
  qk: a product of two run-time values whose result reaches a softmax (scores), with its scale;
  pv: the other products of two run-time values (probabilities x values);
  scale: the element-wise multiply of the scores by a constant;  gelu: the activations;
  conv: the convolutions (`conv@0` the first, `conv@-1` the last).
`role@i` keeps the i-th occurrence only (layer i; -1 the last), `a+b` both; roles are kept
on the program before acc16 (`truncate_float.CENTER_LAST_OUT` off). `none` is `quantize_bf16`
as it is (the last attention's output projection centred, `centered_out.py`), `nocenter` that
off (the program before acc16), `center` on, `lastout` = `attn_out@-1` (the last attention's
output projection float32; an earlier form of the change, `PGX_BF16_WIDE_LAST_OUT` in commit
e1804ba), `center_ROLE` (e.g. `center_ffn_down`) centres the last product of ROLE as well.
"""

from __future__ import annotations

import argparse
import importlib
import collections
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from benchmarks.bf16acc14_precisions import load  # noqa: E402
from benchmarks.cpu_engines import make_openvino, make_ort  # noqa: E402
from benchmarks.cpu_vs_peers import relative_error  # noqa: E402
from pygraphx.ops.base import ViewOp  # noqa: E402
from pygraphx.ops.pointwise import Pointwise  # noqa: E402
from pygraphx.passes.manager import run_passes  # noqa: E402
from pygraphx.passes.pipeline import optimize_passes  # noqa: E402
from pygraphx.quantize.centered_out import center_product  # noqa: E402
from pygraphx.quantize.graph_tail import is_constant_view  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402

tf = importlib.import_module("pygraphx.quantize.truncate_float")
ROLES = ("qkv", "qk", "scale", "pv", "attn_out", "ffn_up", "gelu", "ffn_down")


def _through_pointwise(ins: Any, name: str) -> bool:
    """An instruction named `name` is reached from `ins` through views / pointwise steps."""
    todo, seen = list(ins.outputs), set()
    while todo:
        u = todo.pop()
        if id(u) in seen:
            continue
        seen.add(id(u))
        if u.op.name == name:
            return True
        if isinstance(u.op, ViewOp | Pointwise) and not u.module_inputs:
            todo.extend(u.outputs)
    return False


def role_of(ins: Any) -> str | None:
    name = ins.op.name
    if name == "gelu":
        return "gelu"
    if name == "convolution":
        return "conv"
    if name == "mul" and any(is_constant_view(x) for x in ins.inputs):
        live = [x for x in ins.inputs if not is_constant_view(x)]
        if len(live) == 1 and live[0].op.name == "dot" and role_of(live[0]) == "qk":
            return "scale"
        return None
    if name != "dot":
        return None
    consts = [x for x in ins.inputs if is_constant_view(x)]
    if not consts:
        return "qk" if _through_pointwise(ins, "softmax") else "pv"
    k, n = consts[0].shape.lens()[-2:]
    if n == 3 * k:
        return "qkv"
    if n == k:
        return "attn_out"
    return "ffn_up" if n > k else "ffn_down"


def bf16_program(model: Any, threads: int, keep: str | None) -> Any:
    """`quantize_bf16`'s program with the instructions of role `keep` (roles joined by `+`)
    left float32 (module docstring: `none`, `center`, `nocenter`, `lastout`)."""
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    run_passes(prog, optimize_passes(fuse=False, plan_memory=False))
    main = prog.get_main_module()
    kept: set[int] = set()
    keep = "attn_out@-1" if keep == "lastout" else keep
    if keep is not None and keep.startswith("center_"):  # `center_ROLE`: centre ROLE's last too
        role = keep[len("center_"):]
        found = [i for i in main.instructions if role_of(i) == role]
        mean_product = center_product(main, found[-1]) if found else None
        keep = "center"
    else:
        mean_product = None
    for part in keep.split("+") if keep and keep not in ("center", "nocenter") else []:
        role, _, at = part.partition("@")  # `role@i`: its i-th occurrence only (layer i)
        found = [i for i in main.instructions if role_of(i) == role]
        if at:
            found = found[int(at) :][:1]  # (a negative i counts from the end)
        kept |= {id(i) for i in found}
    if mean_product is not None:
        kept.add(id(mean_product))
    counts = collections.Counter(role_of(i) for i in main.instructions if id(i) in kept)
    original = tf._Truncate.follows_products
    # `none`: the default (centred); `center` / `nocenter`: on / off; roles: off (the program
    # before acc16 with those roles kept float32)
    tf.CENTER_LAST_OUT = None if keep is None else keep == "center"

    def follows(self: Any, ins: Any) -> bool:
        return id(ins) not in kept and original(self, ins)

    tf._Truncate.follows_products = follows
    try:
        tf.truncate_float(prog, "bf16_type", (tf.PRODUCTS,))
    finally:
        tf._Truncate.follows_products = original
        tf.CENTER_LAST_OUT = None
    prog.compile(CpuTarget(threads=threads))
    return prog, dict(counts)


def _runner(prog: Any) -> Callable:
    return lambda feeds: [np.asarray(a) for a in prog.run(feeds)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["minilm"])
    parser.add_argument("--roles", nargs="+", default=["none", *ROLES])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args(argv)
    for name in args.models:
        model, inputs = load(name, args.batch)
        ort, _ = make_ort(model, args.threads)
        ov, _, ov_precision = make_openvino(model, args.threads, None)
        engines: dict[str, Callable] = {}
        for role in args.roles:
            prog, counts = bf16_program(model, args.threads, None if role == "none" else role)
            print(f"{name}: role {role}: kept float32 {counts}", flush=True)
            engines[{"none": "bf16", "nocenter": "bf16_nocenter", "center": "bf16_center"}.get(
                role, f"f32_{role}")] = _runner(prog)
        engines["ov_bf16"] = ov
        rows = collections.defaultdict(list)
        for seed in range(args.seeds):
            feeds = inputs(seed)
            want = ort(feeds)
            line = []
            for key, fn in engines.items():
                err = relative_error(fn(feeds), want)
                rows[key].append(err)
                line.append(f"{key} {err:.4e}")
            print(f"{name} seed {seed}: " + ", ".join(line), flush=True)
        print(f"{name} ({ov_precision}) table input (seed 0) | mean over {args.seeds} seeds:")
        for key, v in rows.items():
            print(f"  {key:12s} {v[0]:.4e} | {statistics.mean(v):.4e}"
                  f"  (vs OV {v[0] / rows['ov_bf16'][0]:.3f} | "
                  f"{statistics.mean(v) / statistics.mean(rows['ov_bf16']):.3f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
