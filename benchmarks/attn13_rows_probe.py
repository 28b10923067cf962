"""Probe: the native kernel's query rows per block (ROWS 16 / 32 / 64), one thread, thread CPU us per
call, median of 15 alternating rounds (results/attn13.md). PYTHONPATH=. python benchmarks/attn13_rows_probe.py"""
import pygraphx, sys, time, statistics, torch
sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
from attn13_ab import operands
from pygraphx.targets.torch_lowering import native_attention as na
torch.set_num_threads(1)
for name, (b,h,d,s,m) in {"bert b1": (1,12,64,128,1), "bert b8": (8,12,64,128,1), "minilm b8": (8,12,32,128,1), "vit b1": (1,12,64,197,0)}.items():
    q, kt, v, mask = operands(b,h,d,s,bool(m))
    fns = {}
    for rows in (16, 32, 64):
        na.ROWS = rows
        p = na.Plan(na.kernel(q.dtype), d**-0.5, q, kt, v, mask, 1)
        fns[rows] = p
    t = {n: [] for n in fns}
    for r in range(15):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for n in order:
            t0 = time.thread_time()
            for _ in range(10): fns[n].run(q, kt, v, mask)
            t[n].append((time.thread_time()-t0)/10)
    print(name, {n: round(statistics.median(x)*1e6) for n, x in t.items()}, flush=True)
