"""gpt12 probe: the cpu target's oneDNN attention primitives one by one (first matmul with scale
and mask, softmax, second matmul, executed directly) for GPT-2's (1, 12, 128, 64) causal block,
then the whole block call, warm and cold (each right after a (128 x 3072) x (3072 x 768)
product), at one and two threads (wall, medians of 100).

    PYTHONPATH=. python benchmarks/gpt12_attention_prims.py bfloat16|float32

The block's output is kept alive (`held`): the primitives' memory objects hold its address.
"""
import sys, time, torch, numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from pygraphx.targets.torch_lowering import onednn_attention as oa
from pygraphx.targets.torch_lowering.attention import _sdpa, _bf16_attention
dtype = getattr(torch, sys.argv[1])
b,h,s,d = 1,12,128,64
def heads(x): return x.view(b,s,h,d).transpose(1,2)
q,k,v = (heads(torch.randn(b,s,h*d).to(dtype)) for _ in range(3)); kt = k.transpose(-1,-2)
tril = torch.tril(torch.ones(s,s,dtype=torch.bool))[None,None]
mask = torch.where(tril, torch.zeros(1,1,1,s), torch.full((1,1,1,s), -3e38))
W = torch.randn(3072, 768).to(dtype); X = torch.randn(128, 3072).to(dtype)
fb = _bf16_attention(0.125) if dtype == torch.bfloat16 else _sdpa(0.125, dtype)
for t in (1, 2):
    torch.set_num_threads(t)
    tab = {}; r = oa.attend(0.125, tab, fb); held = r(q,kt,v,mask)
    prims = [p for key,p in tab.items() if key != 'plans'][0]
    lib, stream = prims.rt.lib, prims.rt.stream
    ex = lib.dnnl_primitive_execute
    for cold in (False, True):
        parts = {i: [] for i in range(4)}
        for _ in range(100):
            if cold: X @ W
            t0 = time.perf_counter()
            for i, (prim, n, args) in enumerate(prims.steps):
                ex(prim, stream, n, args); t1 = time.perf_counter(); parts[i].append(t1 - t0); t0 = t1
            if cold: X @ W
            t0 = time.perf_counter(); held = r(q, kt, v, mask); parts[3].append(time.perf_counter() - t0)
        print(sys.argv[1], f"t{t}", 'cold' if cold else 'warm', 'mm1 / softmax / mm2 (direct):', ' / '.join(f"{np.median(parts[i])*1e6:.0f}" for i in range(3)), f"| sum {sum(np.median(parts[i]) for i in range(3))*1e6:.0f} | whole block call {np.median(parts[3])*1e6:.0f} us")
