"""How stable the generated kernels' autotune is: BERT-base's layer norm at batch 32.

    python benchmarks/group_tune_ab.py [--rows 4096] [--repeats 3] [--json out.json]

The layer-norm group of BERT-base's residual blocks (`add, add, layer norm` over 768 half
values a row, one row per token) is built from a small ONNX graph, as the gpu target fuses it,
once with a half output and once also writing the next GEMM's int8 quantise
(`QuantOutput`). Every launch configuration the autotune tries is timed `--repeats` times two
ways: `old` (launches one after another between CUDA events, as the autotune timed before:
the host's launch time is in it) and `new` (`codegen/triton/timing.py`: the device kept busy
by a spin kernel while the host queues, candidates in turns, device time only). Each repeat
prints every candidate's microseconds and the configuration it would choose. Also times the
standalone int8 quantise (`quantise_kernels.quantise_int8`) of one such tensor.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.codegen.trace import group_trace  # noqa: E402
from pygraphx.codegen.triton.build import build_kernel, candidates  # noqa: E402
from pygraphx.codegen.triton.kernels import QuantOutput  # noqa: E402
from pygraphx.codegen.triton.timing import pick, time_candidates  # noqa: E402
from pygraphx.passes.fusion_policy import RowFusion  # noqa: E402
from pygraphx.passes.manager import run_passes  # noqa: E402
from pygraphx.passes.pipeline import optimize_passes  # noqa: E402

WIDTH = 768


def layer_norm_group(rows: int):
    """The fused `add, add, layer norm` group of a [rows, 768] half residual block."""
    rng = np.random.default_rng(0)
    consts = {
        "bias": rng.standard_normal(WIDTH).astype(np.float16),
        "gamma": rng.standard_normal(WIDTH).astype(np.float16),
        "beta": rng.standard_normal(WIDTH).astype(np.float16),
        "eps": np.array(1e-5, np.float16),
    }
    nodes = [
        helper.make_node("Add", ["x", "bias"], ["a"]),
        helper.make_node("Add", ["a", "res"], ["s"]),
        helper.make_node("ReduceMean", ["s"], ["m"], axes=[-1]),
        helper.make_node("Sub", ["s", "m"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["v"], axes=[-1]),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["g"]),
        helper.make_node("Add", ["g", "beta"], ["y"]),
    ]
    io = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT16, [rows, WIDTH])
        for n in "x res".split()
    ]
    graph = helper.make_graph(
        nodes, "ln", io, [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    run_passes(prog, optimize_passes(plan_memory=False, policy=RowFusion()))
    ins = next(i for i in prog.get_main_module().instructions if i.op.name == "fused_reduce")
    return ins, group_trace(ins)


def _tensor(desc) -> torch.Tensor:
    """Random half values laid out as `desc` (a broadcast input: its one row, expanded)."""
    full = (torch.randn(tuple(desc.lens), device="cuda") * 2).to(torch.float16)
    return full.as_strided(tuple(desc.lens), tuple(desc.strides))


def old_timing(run, reps: int = 20) -> float:
    """The autotune's former timer: launches back to back between events (median, ms)."""
    run()
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    events[0].record()
    for e in events[1:]:
        run()
        e.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in zip(events[:-1], events[1:], strict=True))[
        reps // 2
    ]


def bench(rows: int, repeats: int, where: Path) -> dict:
    ins, group = layer_norm_group(rows)
    xs = [_tensor(d) for d in group.inputs]
    out = torch.empty(tuple(group.output.lens), dtype=torch.float16, device="cuda")
    q = torch.empty(tuple(group.output.lens), dtype=torch.int8, device="cuda")
    scale = torch.tensor([0.05], dtype=torch.float32, device="cuda")
    result: dict = {"rows": rows, "kinds": {}}
    for label, quant in (("half", None), ("half+int8", QuantOutput("int8", store=True))):
        kernel = build_kernel(group, "cuda", directory=where, quant=quant)
        extra = (scale, q) if quant else ()
        options = candidates(kernel._src)
        runs = [lambda c=c, k=kernel, e=extra: k._launch(xs, out, c, e) for c in options]
        entry = {"options": options, "old": [], "new": []}
        for _ in range(repeats):
            old = [old_timing(r) for r in runs]
            new = time_candidates(runs)
            entry["old"].append(old)
            entry["new"].append(new)
            print(
                f"  {label:10s} old "
                + _row(options, old, min(range(len(old)), key=old.__getitem__))
            )
            print(f"  {label:10s} new " + _row(options, new, options.index(pick(new, options))))
        result["kinds"][label] = entry
    from pygraphx.targets.gpu import quantise_kernels as qe

    x = xs[0] if xs[0].is_contiguous() else xs[1]
    qt = time_candidates([lambda: qe.quantise_int8(x, scale, q)])[0]
    print(f"  standalone quantise_int8 of [{rows}, {WIDTH}] half: {qt * 1e3:.2f} us")
    result["quantise_int8_us"] = qt * 1e3
    result["attention_output"] = attention_output_quantise(scale)
    return result


def attention_output_quantise(scale: torch.Tensor) -> dict:
    """Whether BERT-base's attention result (`scaled_dot_product_attention` with a padding
    mask, batch 32, then transpose and reshape to [32, 128, 768]) is dense, and the time of
    its standalone int8 quantise (with the copy `quant.py` makes of a non-dense input)."""
    from pygraphx.targets.gpu import quantise_kernels as qe

    q, k, v = (torch.randn(32, 12, 128, 64, device="cuda", dtype=torch.float16) for _ in "qkv")
    mask = torch.zeros(32, 1, 1, 128, device="cuda", dtype=torch.float16)
    att = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    flat = att.transpose(1, 2).reshape(32, 128, 768)
    shares = flat.untyped_storage().data_ptr() == att.untyped_storage().data_ptr()
    out = torch.empty(32, 128, 768, dtype=torch.int8, device="cuda")

    def quantise() -> None:
        src = flat if flat.is_contiguous() else flat.contiguous()
        qe.quantise_int8(src, scale, out)

    t = time_candidates([quantise])[0]
    found = {"strides": list(att.stride()), "reshape_is_view": shares,
             "dense": flat.is_contiguous(), "quantise_us": t * 1e3}  # fmt: skip
    print(f"  attention output {found}")
    return found


def _row(options, times, chosen: int) -> str:
    cells = [f"w{c['num_warps']}:{t * 1e3:6.2f}" for c, t in zip(options, times, strict=True)]
    return " ".join(cells) + f"  -> w{options[chosen]['num_warps']}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32 * 128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("group_tune_ab.py needs a CUDA/ROCm GPU", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        result = bench(args.rows, args.repeats, Path(tmp))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
