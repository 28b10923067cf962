"""gpt12 probe: GPT-2's causal attention block (1, 12, 128, 64) at batch 1 three ways, each right
after a (128 x 3072) x (3072 x 768) product (its data and code cold, as in the model):
`onednn` (the cpu target's three oneDNN primitives, mask added in the first matmul), `chunked`
(query rows in N chunks, each against only the keys up to its last row: fewer scores, more
primitive calls), `causal` (torch's flash kernel with `is_causal=True`, no mask).

    PYTHONPATH=. python benchmarks/gpt12_causal_probe.py THREADS float32|bfloat16 [CHUNKS]

Prints each variant's largest error against a float64 oracle and its median / fastest time (us;
thread CPU time at one thread, wall otherwise), the variants alternating in both orders.
"""
import sys, time, torch, numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
import torch.nn.functional as F
from pygraphx.targets.torch_lowering import onednn_attention as oa
from pygraphx.targets.torch_lowering.attention import _bf16_attention, _sdpa
threads = int(sys.argv[1]); dtype = getattr(torch, sys.argv[2]); nch = int(sys.argv[3]) if len(sys.argv)>3 else 2
torch.set_num_threads(threads)
b,h,s,d = 1,12,128,64
def heads(x): return x.view(b,s,h,d).transpose(1,2)
q = heads(torch.randn(b,s,h*d).to(dtype)); k = heads(torch.randn(b,s,h*d).to(dtype)); v = heads(torch.randn(b,s,h*d).to(dtype))
kt = k.transpose(-1,-2)
tril = torch.tril(torch.ones(s,s,dtype=torch.bool))[None,None]
pad = torch.zeros(1,1,1,s)
fill = float(np.finfo(np.float32).min)
mask = torch.where(tril, pad, pad+fill)
scale = 0.125
fallback = _bf16_attention(scale) if dtype==torch.bfloat16 else _sdpa(scale, dtype)
one = oa.attend(scale, {}, fallback)
def onednn(): return one(q, kt, v, mask)
tab = {}
chunk = s//nch
fns = [oa.attend(scale, tab, fallback) for _ in range(nch)]
def chunked():
    outs = []
    for i,f in enumerate(fns):
        r0, r1 = i*chunk, (i+1)*chunk
        outs.append(f(q[:,:,r0:r1], kt[...,:r1], v[:,:,:r1], mask[:,:,r0:r1,:r1]))
    return outs
def chunked_out():
    return torch.cat([o.transpose(1,2) for o in chunked()], 1).transpose(1,2)
def causal(): return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
ref = torch.softmax((q.double()@kt.double())*scale + mask.double(), -1) @ v.double()
cands = [('onednn',onednn),('chunked',chunked),('causal',causal)]
for n,f in [('onednn',onednn),('chunked',chunked_out),('causal',causal)]:
    print(n, float((f().double()-ref).abs().max()))
print('impls', [ (k_[0][0], p.impls) for k_,p in tab.items() if k_!='plans'][:4])
W = torch.randn(3072, 768); X = torch.randn(128,3072)
res = {n: [] for n,_ in cands}
clk = time.thread_time if threads==1 else time.perf_counter
for r in range(80):
    for n,f in (cands if r%2 else cands[::-1]):
        X@W
        t=clk(); f(); res[n].append(clk()-t)
for n,v_ in res.items(): print(n, 'median us', round(np.median(v_)*1e6,1), 'min', round(min(v_)*1e6,1))
