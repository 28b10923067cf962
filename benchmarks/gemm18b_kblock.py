"""gemm18b probe: oneDNN's `Linear` (with the residual's sum post-op where `--residual`) against
the native wide kernel unblocked and K-blocked (`gemm_wide_f32_kb`, one run per K block size)
on product shapes with 12 different weights called in turn (cold, as in a model's run), with a
bias, into fixed destinations; best / median of 3 calls x ROUNDS, alternating (order reversed
each round), GFLOP/s and the speed ratio against oneDNN; 1 thread: thread CPU time, else wall
(notes benchmarks/results/gemm18b.md).

    PYTHONPATH=. python benchmarks/gemm18b_kblock.py THREADS ROUNDS KCS SHAPE... [--residual]
    PYTHONPATH=. python benchmarks/gemm18b_kblock.py 1 6 0,512,768 128x3072x768 1024x3072x768
(KCS: K block sizes, comma separated; 0 = unblocked.)
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pygraphx.targets.torch_lowering.native_gemm import WideLinear  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_linear import Linear  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
residual = "--residual" in sys.argv
T, rounds = int(args[0]), int(args[1])
kcs = [int(v) for v in args[2].split(",")]
torch.set_num_threads(T)
clock = time.thread_time if T == 1 else time.perf_counter
g = torch.Generator().manual_seed(0)
print(f"threads {T} residual {residual} loadavg {open('/proc/loadavg').read().split()[:3]}")
for M, k, n in [tuple(int(v) for v in s.split("x")) for s in args[3:]]:
    L = 12
    ws = [torch.randn(k, n, generator=g) * 0.03 for _ in range(L)]
    b = torch.randn(n, generator=g)
    x = torch.randn(M, k, generator=g)
    r0 = torch.randn(M, n, generator=g)
    if residual:
        prims = [Linear(w, b, M, residual="sum") for w in ws]
    else:
        prims = [Linear(w, b, M).primitive() for w in ws]
    wls = [WideLinear(w, b, M) for w in ws]
    ys = [torch.empty(M, n) for _ in range(L)]
    ref = x.double() @ ws[0].double() + b.double() + (r0.double() if residual else 0)
    from pygraphx.targets.torch_lowering import native_gemm

    lib = native_gemm._BOUND.get()
    scratch = {kc: torch.empty(lib.gemm_wide_scratch_kb(M, k, kc)) for kc in kcs}

    def onednn():
        for i in range(L):
            if residual:
                prims[i].into(x, ys[i])
            else:
                prims[i].execute(x, ys[i])

    def wide(kc):
        sp = scratch[kc].data_ptr()

        def run():
            for i in range(L):
                wl = wls[i]
                lib.gemm_wide_f32_kb(x.data_ptr(), M, k, k, wl.packed.data_ptr(),
                                     wl.bias.data_ptr(), n, ys[i].data_ptr(), n, sp, T, kc,
                                     int(residual))  # fmt: skip
        return run

    c = {"onednn": onednn, **{f"wide_kc{kc}": wide(kc) for kc in kcs}}
    for nm, f in c.items():
        for y in ys:
            y.copy_(r0)
        f()
        err = float((ys[0].double() - ref).abs().max() / ref.abs().max())
        print(f"  {nm} err {err:.2e}")
    t = {k_: [] for k_ in c}
    for rd in range(rounds):
        for nm in list(c) if rd % 2 == 0 else list(c)[::-1]:
            for _ in range(3):
                t0 = clock()
                c[nm]()
                t[nm].append(clock() - t0)
    fl = 2 * M * k * n * L
    b0, m0 = min(t["onednn"]), statistics.median(t["onednn"])
    for nm, v in t.items():
        print(f"T{T} {M}x{k}x{n} x{L} {nm:12} best {min(v) * 1e3:8.2f} ms "
              f"{fl / min(v) / 1e9:6.1f} GF/s med {statistics.median(v) * 1e3:8.2f}  "
              f"speed vs onednn best {b0 / min(v):.3f} med {m0 / statistics.median(v):.3f}")  # fmt: skip
    sys.stdout.flush()
