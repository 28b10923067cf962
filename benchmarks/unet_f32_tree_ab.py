"""A zoo model's float32 run time at 2 threads with the pygraphx of the tree on PYTHONPATH (an
A/B of two trees in alternating fresh processes, the lead's check of UNet-small in session 14):

    PYTHONPATH=<tree> PGX_CPU_LOAD_ADAPT=0 python benchmarks/unet_f32_tree_ab.py unet_small
"""

import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # (benchmarks.zoo of this checkout)
import pygraphx
import torch
from benchmarks.zoo import zoo_model
torch.set_num_threads(2)
name = sys.argv[1] if len(sys.argv) > 1 else "unet_small"
path, feeds = zoo_model(name, "full")
p = pygraphx.parse_onnx(str(path))
p.compile(pygraphx.get_target("cpu"))
for _ in range(3):
    p.run(feeds)
best = []
for b in range(4):
    t = time.perf_counter()
    for _ in range(8):
        p.run(feeds)
    best.append((time.perf_counter() - t) / 8 * 1e3)
print(pygraphx.__file__, name, "blocks ms", " ".join(f"{x:.2f}" for x in best), "min", f"{min(best):.2f}")
