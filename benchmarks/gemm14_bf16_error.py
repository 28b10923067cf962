"""bf16 BERT-base b1: relative RMS error against ORT float32 per output, old routes against new, over
8 random token sequences (helper gemm14).

    PYTHONPATH=. python benchmarks/gemm14_bf16_error.py
"""
import sys; sys.path.insert(0, ".")
import numpy as np, onnxruntime as ort, torch
from benchmarks.attn13_ab import load
from benchmarks.minilm13_ab import compile_prog
torch.set_num_threads(2)
data, feeds = load("bert_base:1")
sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
progs = {n: compile_prog(data, 2, env, True) for n, env in (("old", {"PGX_CPU_LAYERNORM_NATIVE": "0", "PGX_CPU_GEMM_RESIDUAL": "off"}), ("new", {}))}
rng = np.random.default_rng(7)
acc = {n: [] for n in progs}
for s in range(8):
    f = {}
    for k, v in feeds.items():
        if k == "input_ids":
            f[k] = rng.integers(1000, 20000, v.shape).astype(v.dtype)
        else:
            f[k] = v
    want = sess.run(None, f)
    for n, p in progs.items():
        got = p.run(f)
        acc[n].append([float(np.sqrt(((np.asarray(g, np.float64) - w) ** 2).sum() / (w.astype(np.float64) ** 2).sum())) for g, w in zip(got, want)])
for n, v in acc.items():
    v = np.array(v); print(n, "mean per output", v.mean(0), "worst-output mean", v.max(1).mean())
