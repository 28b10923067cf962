"""The float32 fixed-weight products of GPT-2 / BERT / MiniLM on other GEMM libraries against
our oneDNN 3.2 `Linear` (helper gemm18, issue 10; notes benchmarks/results/gemm18.md).

Candidates, each computing `y = x @ w (+ b)` for a (rows, K) source into a fixed (rows, N)
destination, all in one process, alternated call block by call block (the order reversed every
round):

* `onednn`: our `onednn_linear.Linear(w, b, rows)` (the cpu target's primitive: the weight
  packed once at construction, the bias in the primitive), executed into a fixed destination
  (`_Primitive.execute`, what a step with an arena slot does). The baseline.
* `openblas`: numpy's bundled scipy-openblas64 (DYNAMIC_ARCH), `cblas_sgemm` through ctypes on
  its .so, `openblas_set_num_threads` to the thread count; the bias NOT added (beta = 0: an upper
  bound of its speed; adding the bias would cost a pass more). B (the weight) is packed by
  OpenBLAS on each call (its API has no prepacked B for sgemm).
* `blis_skx` / `blis_haswell` / `blis_native`: the PyPI wheel `blis` (cython-blis 1.3.4, BLIS
  0.7.0, single-threaded build), `bli_sgemm_ex` through ctypes with a context made by
  `bli_cntx_init_<config>` (its own detection picks `generic` on this Zen 4: `native`); no
  bias (beta = 0). BLIS has no threads in this build: at 2 threads the columns are split in two
  halves run from two Python threads (ctypes releases the GIL). Needs `--blis DIR` (a
  `pip install --target DIR blis` folder; never the shared venv).
* `native_wide`: our native kernel `native_gemm.WideLinear` (`native/kernels/gemm_wide.c`, the
  weight packed once, the bias in the kernel) into the fixed destination, on the shapes its
  rule takes (`native_gemm.available`: the LM head), on every shape with `--wide-all`.
* `onednn_padN` (LM head only, `--pad 16 32 64`): oneDNN with the weight's N padded with zero
  columns to a multiple of the pad, the (rows, N_pad) result dense: whether the odd N = 50257
  tail costs anything (times compared in ms, not GFLOP/s).

1 thread: thread CPU time per call (robust under load); 2 threads: wall time, after a quiet
check (`--wait-quiet S`). Per candidate: best and median of all calls, GFLOP/s on 2 M K N, and
speed ratio to `onednn` (> 1: faster than ours).

    PYTHONPATH=. python benchmarks/gemm18_libs.py --threads 1 --rounds 6 --calls 4 \
        --blis /tmp/gemm18/blis [--only "gpt2 b1"] [--pad 16 32 64]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.ab_harness import loadavg, wait_quiet  # noqa: E402
from pygraphx.targets.torch_lowering import native_gemm  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_linear import Linear  # noqa: E402

#: (name, rows, K, N, bias): GPT-2 b1 (= BERT-base b1's shapes but the LM head: BERT's sequence
#: is 128 rows too), GPT-2 b8 (1024 rows), MiniLM 8 x 128 (1024 rows, hidden 384)
SHAPES = [
    ("gpt2 b1 qkv", 128, 768, 2304, True),
    ("gpt2 b1 proj", 128, 768, 768, True),
    ("gpt2 b1 up", 128, 768, 3072, True),
    ("gpt2 b1 down", 128, 3072, 768, True),
    ("gpt2 b1 lm_head", 128, 768, 50257, False),
    ("gpt2 b8 qkv", 1024, 768, 2304, True),
    ("gpt2 b8 proj", 1024, 768, 768, True),
    ("gpt2 b8 up", 1024, 768, 3072, True),
    ("gpt2 b8 down", 1024, 3072, 768, True),
    ("gpt2 b8 lm_head", 1024, 768, 50257, False),
    ("minilm qkv", 1024, 384, 1152, True),
    ("minilm proj", 1024, 384, 384, True),
    ("minilm up", 1024, 384, 1536, True),
    ("minilm down", 1024, 1536, 384, True),
]


def openblas() -> tuple[ctypes.CDLL, str]:
    """numpy's bundled OpenBLAS (symbols `scipy_...64_`), and its core name."""
    site = Path(np.__file__).resolve().parents[1]
    (path,) = glob.glob(str(site / "numpy.libs" / "libscipy_openblas64_*.so"))
    lib = ctypes.CDLL(path)
    lib.scipy_openblas_get_corename64_.restype = ctypes.c_char_p
    lib.scipy_openblas_get_config64_.restype = ctypes.c_char_p
    i64, f32, vp = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    lib.scipy_cblas_sgemm64_.argtypes = [i64, i64, i64, i64, i64, i64, f32, vp, i64, vp, i64,
                                         f32, vp, i64]  # fmt: skip
    lib.scipy_cblas_sgemm64_.restype = None
    lib.scipy_openblas_set_num_threads64_.argtypes = [ctypes.c_int]
    name = f"{lib.scipy_openblas_get_corename64_().decode()} ({lib.scipy_openblas_get_config64_().decode()})"
    return lib, name


class Blis:
    """cython-blis's BLIS (0.7.0) through ctypes: `bli_sgemm_ex` with a context of one config."""

    def __init__(self, folder: str) -> None:
        sys.path.insert(0, folder)
        import blis.cy  # type: ignore[import-not-found]

        self.lib = lib = ctypes.CDLL(blis.cy.__file__)
        lib.bli_arch_query_id.restype = ctypes.c_int
        lib.bli_arch_string.restype = ctypes.c_char_p
        lib.bli_info_get_version_str.restype = ctypes.c_char_p
        self.detected = lib.bli_arch_string(lib.bli_arch_query_id()).decode()
        self.version = lib.bli_info_get_version_str().decode()
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        lib.bli_sgemm_ex.argtypes = [ctypes.c_int, ctypes.c_int, i64, i64, i64, vp, vp, i64, i64,
                                     vp, i64, i64, vp, vp, i64, i64, vp, vp]  # fmt: skip
        lib.bli_sgemm_ex.restype = None
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.cntx: dict[str, ctypes.Array] = {}

    def context(self, config: str) -> ctypes.Array | None:
        if config == "native":
            return None
        if config not in self.cntx:
            buf = (ctypes.c_char * (1 << 16))()  # (cntx_t is a few KB in 0.7)
            self.lib.bli_init()
            getattr(self.lib, f"bli_cntx_init_{config}")(ctypes.byref(buf))
            self.cntx[config] = buf
        return self.cntx[config]

    def sgemm(self, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, cntx, n0: int, n1: int):
        m, k = x.shape
        n = w.shape[1]
        self.lib.bli_sgemm_ex(
            0, 0, m, n1 - n0, k, ctypes.byref(self.one), x.data_ptr(), k, 1,
            w.data_ptr() + 4 * n0, n, 1, ctypes.byref(self.zero), y.data_ptr() + 4 * n0, n, 1,
            None if cntx is None else ctypes.byref(cntx), None,
        )  # fmt: skip


def candidates(a, m: int, k: int, n: int, bias: bool, x, w, b, y, blas, blis):
    """name -> a no-argument call computing the product into `y` (or a padded destination)."""
    out = {}
    lin = Linear(w, b if bias else None, m)
    prim = lin.primitive()
    out["onednn"] = (lambda: prim.execute(x, y)), prim.impl
    if blas is not None:
        lib, name = blas
        f = lib.scipy_cblas_sgemm64_
        xp, wp, yp = x.data_ptr(), w.data_ptr(), y.data_ptr()
        out["openblas"] = (lambda: f(101, 111, 111, m, n, k, 1.0, xp, k, wp, n, 0.0, yp, n)), name
    if blis is not None:
        for config in a.blis_configs:
            cntx = blis.context(config)
            label = f"{config}" + (f" (detected {blis.detected})" if config == "native" else "")
            if a.threads == 1:
                out[f"blis_{config}"] = (lambda c=cntx: blis.sgemm(x, w, y, c, 0, n)), label
            else:
                half = (n // 2 + 15) // 16 * 16

                def two(c=cntx, half=half):
                    t = threading.Thread(target=blis.sgemm, args=(x, w, y, c, half, n))
                    t.start()
                    blis.sgemm(x, w, y, c, 0, half)
                    t.join()

                out[f"blis_{config}"] = two, label + ", 2 Python threads"
    if not a.no_wide and native_gemm.available(w, m) or a.wide_all:
        wl = native_gemm.WideLinear(w, b if bias else None, m)
        fn, bp = wl.fn, (wl.bias.data_ptr() if wl.bias is not None else None)
        args = (x.data_ptr(), m, k, k, wl.packed.data_ptr(), bp, n, y.data_ptr(), n,
                wl.scratch.data_ptr(), a.threads)  # fmt: skip
        rule = "taken" if native_gemm.available(w, m) else "not taken"
        out["native_wide"] = (lambda wl=wl: fn(*args)), f"gemm_wide.c 8x48 (the rule: {rule})"
    if n == 50257:
        for pad in a.pad:
            npad = (n + pad - 1) // pad * pad
            wp_ = torch.zeros(k, npad)
            wp_[:, :n] = w
            lp = Linear(wp_, None, m)
            pp = lp.primitive()
            yp_ = torch.empty(m, npad)
            out[f"onednn_pad{pad}"] = (lambda pp=pp, yp_=yp_: pp.execute(x, yp_)), f"N={npad}"
    return out, lin


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=4, help="calls per candidate per round")
    ap.add_argument("--only", action="append", default=[], help="shapes whose name has this")
    ap.add_argument("--blis", default=None, help="a `pip install --target` folder with blis")
    ap.add_argument("--blis-configs", nargs="*", default=["skx", "haswell"])
    ap.add_argument("--no-openblas", action="store_true")
    ap.add_argument("--pad", type=int, nargs="*", default=[16, 32, 64])
    ap.add_argument("--no-wide", action="store_true", help="no `native_wide` candidate")
    ap.add_argument("--wide-all", action="store_true",
                    help="`native_wide` on every shape (else where its rule takes it)")
    ap.add_argument("--wait-quiet", type=float, default=0.0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    blas = None if a.no_openblas else openblas()
    if blas is not None:
        blas[0].scipy_openblas_set_num_threads64_(a.threads)
    blis = Blis(a.blis) if a.blis else None
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} threads {a.threads} "
          f"({'thread CPU' if a.threads == 1 else 'wall'}), rounds {a.rounds} x calls "
          f"{a.calls}, loadavg {' '.join(loadavg())}")  # fmt: skip
    if blas is not None:
        print(f"# openblas core: {blas[1]}")
    if blis is not None:
        print(f"# blis {blis.version}, its own detection on this CPU: {blis.detected}")
    g = torch.Generator().manual_seed(0)
    for name, m, k, n, bias in SHAPES:
        if a.only and not any(o in name for o in a.only):
            continue
        w = torch.randn(k, n, generator=g) * 0.03
        b = torch.randn(n, generator=g)
        x = torch.randn(m, k, generator=g)
        y = torch.empty(m, n)
        ref = (x.double() @ w.double() + (b.double() if bias else 0)).float()
        cands, lin = candidates(a, m, k, n, bias, x, w, b, y, blas, blis)
        errs = {}
        for cname, (fn, _) in cands.items():
            y.fill_(float("nan"))
            fn()
            want = ref if cname == "onednn" or not bias else ref - b
            if cname.startswith("onednn_pad"):
                errs[cname] = "-"
                continue
            errs[cname] = f"{float((y - want).abs().max() / want.abs().max()):.1e}"
            fn()
        if a.threads > 1 and a.wait_quiet:
            print(f"# {name}: {wait_quiet(a.wait_quiet)}, loadavg {' '.join(loadavg())}")
        times: dict[str, list[float]] = {c: [] for c in cands}
        order = list(cands)
        for r in range(a.rounds):
            for cname in order if r % 2 == 0 else order[::-1]:
                fn = cands[cname][0]
                for _ in range(a.calls):
                    t0 = clock()
                    fn()
                    times[cname].append(clock() - t0)
        flop = 2.0 * m * k * n
        base_best, base_med = min(times["onednn"]), statistics.median(times["onednn"])
        print(f"\n{name}: {m} x {k} x {n}{' + bias' if bias else ''} ({flop / 1e9:.2f} GFLOP)")
        print(f"  {'candidate':14} {'best ms':>9} {'med ms':>9} {'GF/s best':>9} {'GF/s med':>9}"
              f" {'vs onednn best':>14} {'med':>6}  rel err   kernel")  # fmt: skip
        for cname, (_, label) in cands.items():
            t = times[cname]
            best, med = min(t), statistics.median(t)
            print(f"  {cname:14} {best * 1e3:9.3f} {med * 1e3:9.3f} {flop / best / 1e9:9.1f} "
                  f"{flop / med / 1e9:9.1f} {base_best / best:14.3f} {base_med / med:6.3f}  "
                  f"{errs[cname]:7}  {label}")  # fmt: skip
        sys.stdout.flush()
        del cands, lin
    print(f"\n# end {time.strftime('%H:%M:%S')}, loadavg {' '.join(loadavg())}")


if __name__ == "__main__":
    main()
