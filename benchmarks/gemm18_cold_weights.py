"""gemm18 probe: oneDNN's `Linear` against the native wide kernel (`native_gemm.WideLinear`) on
a product shape with 12 different weights called in turn (cold, as in a model's run), with a
bias, into fixed destinations; best / median of 3 calls x ROUNDS, alternating, GFLOP/s and the
speed ratio (notes benchmarks/results/gemm18.md, section 4).

    PYTHONPATH=. python benchmarks/gemm18_cold_weights.py THREADS ROUNDS 128x768x3072 128x768x2304
"""
import sys, time, statistics, ctypes, torch
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1]))
from pygraphx.targets.torch_lowering.onednn_linear import Linear
from pygraphx.targets.torch_lowering.native_gemm import WideLinear
T = int(sys.argv[1]); rounds = int(sys.argv[2])
torch.set_num_threads(T)
clock = time.thread_time if T == 1 else time.perf_counter
g = torch.Generator().manual_seed(0)
for (M, k, n) in [tuple(int(v) for v in s.split("x")) for s in sys.argv[3:]]:
    L = 12
    ws = [torch.randn(k, n, generator=g) * 0.03 for _ in range(L)]
    b = torch.randn(n, generator=g)
    x = torch.randn(M, k, generator=g)
    prims = [Linear(w, b, M).primitive() for w in ws]
    wls = [WideLinear(w, b, M) for w in ws]
    ys = [torch.empty(M, n) for _ in range(L)]
    ref = x.double() @ ws[0].double() + b.double()
    print('err', float((wls[0](x).double() - ref).abs().max() / ref.abs().max()))
    def one():
        for i in range(L): prims[i].execute(x, ys[i])
    def mine():
        for i in range(L):
            wl = wls[i]; wl.fn(x.data_ptr(), M, k, k, wl.packed.data_ptr(), wl.bias.data_ptr(), n, ys[i].data_ptr(), n, wl.scratch.data_ptr(), T)
    c = {'onednn': one, 'wide': mine}
    for f in c.values(): f()
    t = {k_: [] for k_ in c}
    for r in range(rounds):
        for nm in (list(c) if r % 2 == 0 else list(c)[::-1]):
            for _ in range(3):
                t0 = clock(); c[nm](); t[nm].append(clock() - t0)
    fl = 2 * M * k * n * L; b0 = min(t['onednn']); m0 = statistics.median(t['onednn'])
    for nm, v in t.items():
        print(f"T{T} {M}x{k}x{n} x{L} weights {nm:8} best {min(v)*1e3:8.2f} ms {fl/min(v)/1e9:6.1f} GF/s med {statistics.median(v)*1e3:8.2f}  speed vs onednn best {b0/min(v):.3f} med {m0/statistics.median(v):.3f}")
    sys.stdout.flush()
