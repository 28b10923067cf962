"""ResNet-50's 1x1 layers with the activations in the layout oneDNN picks (`any`: nChw16c on
AVX-512) against channels-last (nhwc, what pygraphx runs), each with its epilogue (bias + relu;
the residual layers bias + sum post-op over the residual + relu), timed as
`benchmarks/rn11_layers.py` times them (`conv_choice.race`). The blocked form is what a whole
chain in nChw16c (reorders at its ends only) would run per layer.

    python benchmarks/rn11_blocked.py --batch 1 --threads 1 --flush-mb 64
"""

from __future__ import annotations

import argparse
import sys
from ctypes import c_void_p
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401,I001  (first: OpenMP's spin count before torch)
import torch  # noqa: E402

from benchmarks.rn11_layers import LAYERS, cl, plan_of  # noqa: E402
from pygraphx.targets.torch_lowering import conv_choice, onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_capi as capi  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_conv_primitive import Descriptor  # noqa: E402


class AnyLayout(Descriptor):
    """A layer's descriptor with source and destination in the layout oneDNN chooses."""

    def _md(self, dims: list[int], tag: int, dtype: torch.dtype | None = None) -> c_void_p:
        return super()._md(dims, capi.TAG_ANY if tag == capi.TAG_NHWC else tag, dtype)


def blocked(plan: object, impl: str | None) -> tuple[object, list[torch.Tensor], str]:
    """(closure running `plan` on oneDNN's implementation `impl` in the layouts it picks, its
    source and destination buffers, "implementation (source layout)")."""
    rt = onednn_conv._runtime_for([plan])
    with capi.primitive_cache_off(rt.lib):
        d = AnyLayout(rt, plan, False, impl)
        d.prim = rt.primitive(d.pd)
    lib, pd = rt.lib, d.pd
    nhwc = rt.desc(d.x_lens, capi.DTYPES[plan.weight.dtype], capi.TAG_NHWC)
    layout = "nhwc" if lib.dnnl_memory_desc_equal(nhwc, d.src_md) else "blocked"

    def md(arg: int) -> c_void_p:
        return lib.dnnl_primitive_desc_query_md(pd, capi.QUERY_EXEC_ARG_MD, arg)

    def buffer(m: c_void_p) -> torch.Tensor:
        return torch.full((max(lib.dnnl_memory_desc_get_size(m), 4) // 4,), 0.5)

    d.src_md = md(capi.ARG_SRC)
    layout = "nhwc" if lib.dnnl_memory_desc_equal(nhwc, d.src_md) else "blocked"
    lib.dnnl_memory_desc_destroy(nhwc)
    src, dst = buffer(md(capi.ARG_SRC)), buffer(md(capi.ARG_DST))
    w_md = md(capi.ARG_WEIGHTS)
    weight = rt.reorder(plan.weight.contiguous(), d._md(d.w_dims, d.w_tag), w_md)
    scratch = buffer(md(capi.ARG_SCRATCHPAD))
    args = [(capi.ARG_SRC, src), (capi.ARG_DST, dst), (capi.ARG_WEIGHTS, weight),
            (capi.ARG_BIAS, plan.bias), (capi.ARG_SCRATCHPAD, scratch)]  # fmt: skip
    mems = [(a, d._memory(md(a), t.data_ptr())) for a, t in args]
    bound = (capi.ExecArg * len(mems))(*(capi.ExecArg(a, m) for a, m in mems))

    def run() -> None:
        capi.check(lib.dnnl_primitive_execute(d.prim, rt.stream, len(mems), bound), "conv")

    run.keep = (d, weight, args)  # type: ignore[attr-defined]
    return run, [src, dst], f"{rt.impl_name(pd)} ({layout})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--flush-mb", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--impl", default="jit_1x1:avx512_core", help="the `any` layout's kernel")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    conv_choice.FLUSH_BYTES = args.flush_mb << 20
    print(f"# b{args.batch} t{args.threads} flush {args.flush_mb} MiB, ms per call (best)")
    for c, h, w, k, stride, residual, n in LAYERS:
        plan = plan_of(args.batch, c, h, w, k, stride, "relu")
        plan = replace(plan, accumulate=residual)  # the residual: a sum over the output
        x = cl([args.batch, c, h, w])
        out = cl(onednn_conv.geometry(plan)[3])
        nhwc = onednn_conv.build(plan, lambda x=x: x, None, out)
        run, bufs, impl = blocked(plan, args.impl)
        best: dict[str, float] = {}
        for _ in range(args.repeat):
            times = conv_choice.race({"nhwc": nhwc, "blocked": run}, [x, out, *bufs])
            for name, sec in times.items():
                best[name] = min(best.get(name, 1.0), sec)
        form = "sum" if residual else "plain"
        print(f"({c},{h},{w})->{k} s{stride} x{n} {form}: nhwc {best['nhwc'] * 1e3:.3f} "
              f"[{nhwc.primitives[args.threads].impl}], blocked {best['blocked'] * 1e3:.3f} "
              f"[{impl}]")  # fmt: skip


if __name__ == "__main__":
    main()
