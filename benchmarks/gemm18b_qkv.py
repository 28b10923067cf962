"""gemm18b probe: a product in column parts (Q / K / V: a (parts, rows, N / parts) result) on
oneDNN's batched matmul (`onednn_linear.Linear(parts=...)`, the lowering's
`dnnl_parts_kernel`) against the native wide kernel (`native_gemm.WideLinear(parts=...)`),
12 different weights called in turn (cold, as in a model's run), with a bias, each call making
its result as in a run; best / median of 3 calls x ROUNDS, alternating (order reversed each
round); 1 thread: thread CPU time, else wall (notes benchmarks/results/gemm18b.md).

    PYTHONPATH=. python benchmarks/gemm18b_qkv.py THREADS ROUNDS 128x768x2304 1024x384x1152
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pygraphx.targets.torch_lowering.native_gemm import WideLinear  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_linear import Linear  # noqa: E402

T, rounds, parts = int(sys.argv[1]), int(sys.argv[2]), 3
torch.set_num_threads(T)
clock = time.thread_time if T == 1 else time.perf_counter
g = torch.Generator().manual_seed(0)
print(f"threads {T} loadavg {open('/proc/loadavg').read().split()[:3]}")
for M, k, n in [tuple(int(v) for v in s.split("x")) for s in sys.argv[3:]]:
    L = 12
    ws = [torch.randn(k, n, generator=g) * 0.03 for _ in range(L)]
    b = torch.randn(n, generator=g)
    x = torch.randn(M, k, generator=g)
    dnnl = [Linear(w, b, M, parts=parts) for w in ws]
    wide = [WideLinear(w, b, M, parts=parts) for w in ws]
    ref = (x.double() @ ws[0].double() + b.double()).reshape(M, parts, n // parts).transpose(0, 1)
    for nm, f in (("onednn", dnnl[0]), ("wide", wide[0])):
        y = f(x)
        assert tuple(y.shape) == (parts, M, n // parts), y.shape
        print(f"  {nm} err {float((y.double() - ref).abs().max() / ref.abs().max()):.2e}")
    c = {"onednn": lambda: [f(x) for f in dnnl], "wide": lambda: [f(x) for f in wide]}
    for f in c.values():
        f()
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
        print(f"T{T} {M}x{k}x{n} parts {parts} x{L} {nm:8} best {min(v) * 1e3:8.2f} ms "
              f"{fl / min(v) / 1e9:6.1f} GF/s med {statistics.median(v) * 1e3:8.2f}  "
              f"speed vs onednn best {b0 / min(v):.3f} med {m0 / statistics.median(v):.3f}")  # fmt: skip
    sys.stdout.flush()
