"""gemm18 probe: oneDNN's `Linear` against the native wide kernel on one (rows x K x N) weight
each, no bias, fixed destinations (the rows / K limits of `native_gemm.available`; notes
benchmarks/results/gemm18.md, section 2).

    PYTHONPATH=. python benchmarks/gemm18_sizes.py THREADS ROUNDS 4x768x50257 128x4096x16384
"""
import sys, time, statistics, ctypes, torch
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1]))
from pygraphx.targets.torch_lowering.onednn_linear import Linear
from pygraphx.targets.torch_lowering.native_gemm import WideLinear
T = int(sys.argv[1]); rounds = int(sys.argv[2])
torch.set_num_threads(T)
clock = time.thread_time if T == 1 else time.perf_counter
g = torch.Generator().manual_seed(0)
shapes = [tuple(int(v) for v in s.split('x')) for s in sys.argv[3:]]
for (M, k, n) in shapes:
    w = torch.randn(k, n, generator=g) * 0.03
    x = torch.randn(M, k, generator=g)
    prim = Linear(w, None, M).primitive(); wl = WideLinear(w, None, M)
    y0, y1 = torch.empty(M, n), torch.empty(M, n)
    ref = x.double() @ w.double()
    def mine():
        wl.fn(x.data_ptr(), M, k, k, wl.packed.data_ptr(), None, n, y1.data_ptr(), n, wl.scratch.data_ptr(), T)
    c = {'onednn': lambda: prim.execute(x, y0), 'wide': mine}
    for f in c.values(): f()
    print('err', float((y1.double() - ref).abs().max() / ref.abs().max()))
    t = {k_: [] for k_ in c}
    for r in range(rounds):
        for nm in (list(c) if r % 2 == 0 else list(c)[::-1]):
            for _ in range(3):
                t0 = clock(); c[nm](); t[nm].append(clock() - t0)
    fl = 2 * M * k * n; b0 = min(t['onednn']); m0 = statistics.median(t['onednn'])
    for nm, v in t.items():
        print(f"T{T} {M}x{k}x{n} {nm:8} best {min(v)*1e3:8.2f} ms {fl/min(v)/1e9:6.1f} GF/s med {statistics.median(v)*1e3:8.2f}  speed vs onednn best {b0/min(v):.3f} med {m0/statistics.median(v):.3f}")
    sys.stdout.flush()
