"""Micro (helper gemm14): a fixed-weight product plus a residual, three ways: the product then
an in-place `add_`, oneDNN binary add post-op (`Linear(residual="add")`), sum post-op into the
residual (`Linear(residual="sum").into`); one thread: thread CPU, else wall; a flush between calls.

    PYTHONPATH=. python benchmarks/gemm14_postop_micro.py 1
"""
import time, torch, sys
from pygraphx.targets.torch_lowering.onednn_linear import Linear
torch.set_num_threads(int(sys.argv[1]))
clock = time.thread_time if sys.argv[1] == "1" else time.perf_counter
for m, k, n in ((1024, 384, 384), (1024, 1536, 384), (128, 768, 768), (128, 3072, 768)):
    w = torch.randn(k, n); b = torch.randn(n); x = torch.randn(m, k); r = torch.randn(m, n)
    a = Linear(w, b, m); c = Linear(w, b, m, residual="add"); d = Linear(w, b, m, residual="sum")
    ref = (x.double() @ w.double() + b.double() + r.double())
    y1 = a(x).add_(r); y2 = c(x, r); y3 = d.into(x, r.clone())
    es = [(y.double()-ref).abs().max().item() for y in (y1, y2, y3)]
    junk = torch.empty(8 << 20)
    T = [[], [], []]
    rr = [r.clone() for _ in range(3)]
    for i in range(30):
        order = (0, 1, 2) if i % 2 == 0 else (2, 1, 0)
        for which in order:
            junk.add_(1.0)
            s = clock()
            if which == 0: a(x).add_(r)
            elif which == 1: c(x, r)
            else: d.into(x, rr[i % 3])
            T[which].append(clock() - s)
    med = [sorted(t)[len(t)//2]*1e6 for t in T]
    print(f"{m}x{k}x{n}: add_ {med[0]:8.1f}  binary {med[1]:8.1f}  sum {med[2]:8.1f} us; err {es[0]:.1e} {es[1]:.1e} {es[2]:.1e}; {d.primitive().impl}")
