"""Probe: an attention block as a loop over heads in C (oneDNN's primitives per head or group of
heads, the score buffer small enough to stay in L1 / L2) against the batched three primitives.

    PYTHONPATH=. python benchmarks/attn10_cloop_probe.py --threads 1

Needs a C compiler (`cc`): a 20-line loop (set the four operand handles at a head's offset, run
the three primitives) is compiled into a temporary library linked to the oneDNN library that
`onednn_capi` loaded, and called once per block through ctypes, so the per-head calls cost no
Python; the operands either the head views of the (b, s, h * d) products (rows h * d apart:
oneDNN 3.2 then takes `gemm:jit`) or dense (b, h, s, d) copies ("heads-major", as if the
products wrote them so). A probe of what such a loop would gain, not a kernel pygraphx uses.
Each candidate runs
right after a (128 x 3072) x (3072 x 768) product and the three (128 x 768) x (768 x 768) Q / K /
V products that write its operands (`cold`), then again at once (`warm`); printed: median
(fastest) microseconds, thread CPU time at one thread, wall otherwise, the implementations
oneDNN took, and the largest difference from the batched block.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
import time
from ctypes import POINTER, c_int, c_long, c_void_p
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attn10_cold import arguments  # noqa: E402

from pygraphx.targets.torch_lowering import onednn_attention as oa  # noqa: E402
from pygraphx.targets.torch_lowering.attention import _sdpa  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_capi import runtime  # noqa: E402

LOOP = r"""
typedef void *dnnl_primitive_t, *dnnl_memory_t, *dnnl_stream_t;
typedef struct { int arg; dnnl_memory_t memory; } dnnl_exec_arg_t;
extern int dnnl_memory_set_data_handle(dnnl_memory_t, void *);
extern int dnnl_primitive_execute(dnnl_primitive_t, dnnl_stream_t, int, const dnnl_exec_arg_t *);
int heads_loop(int chunks, dnnl_stream_t stream, dnnl_primitive_t *prims, int *nargs,
               dnnl_exec_arg_t **args, dnnl_memory_t *mems, char **bases, long *steps) {
    for (int c = 0; c < chunks; ++c) {
        for (int m = 0; m < 4; ++m)
            if (dnnl_memory_set_data_handle(mems[m], bases[m] + c * steps[m])) return -1;
        for (int p = 0; p < 3; ++p) {
            int st = dnnl_primitive_execute(prims[p], stream, nargs[p], args[p]);
            if (st) return st;
        }
    }
    return 0;
}
"""


def build(folder: Path, dnnl: str) -> ctypes.CDLL:
    """The loop compiled into a library linked to oneDNN's `dnnl` (a path)."""
    src, lib = folder / "heads.c", folder / "libheads.so"
    src.write_text(LOOP)
    where = str(Path(dnnl).parent)
    cmd = ["cc", "-O2", "-shared", "-fPIC", str(src), "-o", str(lib), f"-L{where}",
           f"-l:{Path(dnnl).name}", f"-Wl,-rpath,{where}"]  # fmt: skip
    subprocess.run(cmd, check=True)
    loop = ctypes.CDLL(str(lib))
    loop.heads_loop.restype = c_int
    loop.heads_loop.argtypes = [c_int, c_void_p, POINTER(c_void_p), POINTER(c_int),
                                POINTER(c_void_p), POINTER(c_void_p), POINTER(c_void_p),
                                POINTER(c_long)]  # fmt: skip
    return loop


def looped(loop, rt, g: int, dims: tuple, scale: float, mask: torch.Tensor, heads_major: bool):
    """A block function running `g` heads a call of the C loop, and its primitives: operands
    the (b, h, s, d) views of (b, s, h * d) products, or (`heads_major`) dense (b, h, s, d)."""
    b, h, s, d = dims
    n = h // g
    row = d if heads_major else h * d  # between a head's rows
    head = s * d if heads_major else d  # between heads
    q_, kt_ = ((s, d), (row, 1)), ((d, s), (1, row))
    layouts = (q_, kt_, q_, ((1, s), (s, 1)))  # one head: 2-D operands
    if g > 1:
        q_ = ((1, g, s, d), (s * h * d, head, row, 1))
        kt_ = ((1, g, d, s), (s * h * d, head, 1, row))
        layouts = (q_, kt_, q_, ((1, 1, 1, s), (s, s, s, 1)))
    prims = oa.Primitives(rt, (layouts, (torch.float32, torch.float32), scale,
                               torch.get_num_threads()))  # fmt: skip
    rt.lib.dnnl_memory_set_data_handle(prims.mask, mask.data_ptr())
    handles = (c_void_p * 3)(*[p for p, _, _ in prims.steps])
    nargs = (c_int * 3)(*[k for _, k, _ in prims.steps])
    args = (c_void_p * 3)(*[ctypes.cast(a, c_void_p) for _, _, a in prims.steps])
    mems = (c_void_p * 4)(prims.q, prims.kt, prims.v, prims.out)
    step = g * head * 4
    steps = (c_long * 4)(step, step, step, g * s * d * 4)

    def run(q, kt, v, m):
        o = torch.empty(b, h, s, d)
        bases = (c_void_p * 4)(q.data_ptr(), kt.data_ptr(), v.data_ptr(), o.data_ptr())
        status = loop.heads_loop(n, rt.stream, handles, nargs, args, mems, bases, steps)
        if status:
            raise RuntimeError(f"heads_loop: oneDNN status {status}")
        if g > 1:  # each chunk written (s, g, d), as the primitives lay out their output
            return o.view(n, s, g, d).permute(0, 2, 1, 3).reshape(b, h, s, d)
        return o

    return run, prims


def bound(fn, operands: tuple):
    """`fn` on these operands, whatever it is called with."""
    return lambda *_: fn(*operands)


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, argv)
    clock = time.thread_time_ns if args.threads == 1 else time.perf_counter_ns
    rt = runtime()
    if rt is None:
        print("oneDNN's C API library is not loaded")
        return 1
    oa._declare(rt)
    dims = b, h, s, d = (1, 12, 128, 64)
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(b, s, h * d, generator=gen) for _ in range(3)]
    q, k, v = (p.view(b, s, h, d).transpose(1, 2) for p in parts)
    kt = k.transpose(-1, -2)
    mask = torch.zeros(b, 1, 1, s)
    mask[..., -5:] = -1e4
    scale = d**-0.5
    full = oa.attend(scale, {}, _sdpa(scale, torch.float32))
    ref = full(q, kt, v, mask)
    hm = [torch.empty(b, h, s, d) for _ in parts]  # head-major copies, refreshed per call
    fns, kept = {"batched (3 primitives)": full}, []
    with tempfile.TemporaryDirectory() as folder:
        loop = build(Path(folder), rt.lib._name)
        for major in (False, True):
            for g in (1, 2, 3, 4, 6):
                run, prims = looped(loop, rt, g, dims, scale, mask, major)
                kept.append(prims)
                ops = (hm[0], hm[1].transpose(-1, -2), hm[2]) if major else (q, kt, v)
                for t, src in zip(hm, (q, k, v), strict=True):
                    t.copy_(src)
                diff = float((run(*ops, mask) - ref).abs().max())
                name = f"C loop, {g} head(s) a call{', heads-major' if major else ''}"
                print(f"{name}: {prims.impls}, diff {diff:.1e}")
                fns[name] = bound(run, (*ops, mask))
        fns["batched, heads-major"] = bound(full, (hm[0], hm[1].transpose(-1, -2), hm[2], mask))
        h_, w_ = torch.randn(128, 3072, generator=gen), torch.randn(3072, 768, generator=gen)
        x, ws = torch.randn(s, h * d, generator=gen), [torch.randn(768, 768) / 30 for _ in parts]
        cold = {n: [] for n in fns}
        warm = {n: [] for n in fns}
        with torch.inference_mode():
            for r in range(args.calls):
                for name, fn in fns.items() if r % 2 == 0 else reversed(list(fns.items())):
                    torch.mm(h_, w_)
                    for p, w, t in zip(parts, ws, hm, strict=True):  # the products
                        torch.mm(x, w, out=p.view(s, h * d))
                        t.view(b, s, h, d).copy_(p.view(b, s, h, d))  # as if written heads-major
                    t0 = clock()
                    fn(q, kt, v, mask)
                    t1 = clock()
                    fn(q, kt, v, mask)
                    t2 = clock()
                    cold[name].append((t1 - t0) / 1e3)
                    warm[name].append((t2 - t1) / 1e3)
    mid = args.calls // 2
    for name in fns:
        c, m = sorted(cold[name]), sorted(warm[name])
        print(f"  {name:28s} cold {c[mid]:7.1f} ({c[0]:7.1f})  warm {m[mid]:7.1f} ({m[0]:7.1f}) us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
