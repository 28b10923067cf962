"""gemm18b probe: the native wide kernel as merged by gemm18 (main 9737f5d's
`native/kernels/gemm_wide.c`, A packed element by element; read from git, built as
`gemm_wide_gemm18`) against this branch's (A packed by 8 x 8 transposes), the same packed
weights, 12 weights in turn (1 for a head shape), with a bias; best / median of 3 calls x
ROUNDS, alternating (order reversed each round); 1 thread: thread CPU time, else wall
(notes benchmarks/results/gemm18b.md).

    PYTHONPATH=. python benchmarks/gemm18b_pack_ab.py THREADS ROUNDS 128x768x3072 128x768x50257
"""
import ctypes
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pygraphx.targets.native import compiler  # noqa: E402
from pygraphx.targets.torch_lowering import native_gemm  # noqa: E402
from pygraphx.targets.torch_lowering.native_gemm import WideLinear  # noqa: E402

OLD = "9737f5d"
src = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD}:pygraphx/targets/native/kernels/gemm_wide.c"],
                     check=True, capture_output=True, text=True).stdout  # fmt: skip
old = compiler.load_source("gemm_wide_gemm18", src)
new = native_gemm._BOUND.get()
i64, vp = ctypes.c_int64, ctypes.c_void_p
old.gemm_wide_f32.argtypes = [vp, i64, i64, i64, vp, vp, i64, vp, i64, vp, i64]
old.gemm_wide_f32.restype = ctypes.c_int
T, rounds = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(T)
clock = time.thread_time if T == 1 else time.perf_counter
g = torch.Generator().manual_seed(0)
print(f"threads {T} loadavg {open('/proc/loadavg').read().split()[:3]}")
for M, k, n in [tuple(int(v) for v in s.split("x")) for s in sys.argv[3:]]:
    L = 12 if n < 16384 else 1
    ws = [torch.randn(k, n, generator=g) * 0.03 for _ in range(L)]
    b = torch.randn(n, generator=g)
    x = torch.randn(M, k, generator=g)
    wls = [WideLinear(w, b, M) for w in ws]
    ys = [torch.empty(M, n) for _ in range(L)]
    ref = x.double() @ ws[0].double() + b.double()

    def make(fn):
        def run():
            for i in range(L):
                wl = wls[i]
                fn(x.data_ptr(), M, k, k, wl.packed.data_ptr(), wl.bias.data_ptr(), n,
                   ys[i].data_ptr(), n, wl.scratch.data_ptr(), T)  # fmt: skip
        return run

    c = {"gemm18": make(old.gemm_wide_f32), "gemm18b": make(new.gemm_wide_f32)}
    for nm, f in c.items():
        f()
        print(f"  {nm} err {float((ys[0].double() - ref).abs().max() / ref.abs().max()):.2e}")
    t = {k_: [] for k_ in c}
    for rd in range(rounds):
        for nm in list(c) if rd % 2 == 0 else list(c)[::-1]:
            for _ in range(3):
                t0 = clock()
                c[nm]()
                t[nm].append(clock() - t0)
    fl = 2 * M * k * n * L
    b0, m0 = min(t["gemm18"]), statistics.median(t["gemm18"])
    for nm, v in t.items():
        print(f"T{T} {M}x{k}x{n} x{L} {nm:8} best {min(v) * 1e3:8.2f} ms "
              f"{fl / min(v) / 1e9:6.1f} GF/s med {statistics.median(v) * 1e3:8.2f}  "
              f"speed vs gemm18 best {b0 / min(v):.3f} med {m0 / statistics.median(v):.3f}")  # fmt: skip
    sys.stdout.flush()
