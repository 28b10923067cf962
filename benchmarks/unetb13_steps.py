"""UNet-small's steps with and without `swap_resize_convolution` (helper unetb13): 1 thread,
thread CPU time per step (`profile.time_steps` with `time.thread_time`), best of 4 alternating
rounds of 5 runs; prints the sum of the steps and the resize, concat and small convolution rows.

    PYTHONPATH=. python benchmarks/unetb13_steps.py bf16     # or f32
"""
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cpu_vs_peers import load_zoo
import pygraphx as pgx
from pygraphx.targets.cpu.target import CpuTarget
from pygraphx.targets.cpu.profile import time_steps
prec = sys.argv[1]
model, feeds, _ = load_zoo("unet_small", "full")
progs = {}
for v, env in (("noswap", "swap_resize_convolution"), ("new", "")):
    os.environ["PGX_DISABLE_PASSES"] = env
    p = pgx.parse_onnx_buffer(model.SerializeToString())
    if prec == "bf16":
        pgx.quantize_bf16(p)
    p.compile(CpuTarget(threads=1))
    p.run(feeds)
    progs[v] = p
best = {}
for r in range(4):
    for v in (("noswap", "new") if r % 2 == 0 else ("new", "noswap")):
        st = time_steps(progs[v]._executable, feeds, 5, clock=time.thread_time)
        best.setdefault(v, [None] * len(st))
        for k, s in enumerate(st):
            best[v][k] = s if best[v][k] is None or s.seconds < best[v][k].seconds else best[v][k]
for v in best:
    tot = sum(s.seconds for s in best[v])
    print(f"== {v} {prec}: sum of best steps {tot*1e3:.2f} ms")
    for s in best[v]:
        names = [i.op.name + str(list(i.shape.lens())[1:2]) for i in s.instructions if not i.is_literal()]
        txt = "+".join(names) if isinstance(names, list) else names
        if any(k in txt for k in ("resize", "concat")) or ("convolution" in txt and s.seconds < 0.003):
            print(f"  {s.seconds*1e3:7.3f}  {txt[:90]}")
