"""gpt12 probe: the cpu target's oneDNN attention primitives one by one (first matmul with scale
and mask, softmax, second matmul) for GPT-2's (1, 12, 128, 64) causal block, warm, at one and
two threads (wall, median of 200), and the whole block call.

    PYTHONPATH=. python benchmarks/gpt12_attention_prims.py bfloat16|float32
"""
import sys, time, torch, numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from pygraphx.targets.torch_lowering import onednn_attention as oa
from pygraphx.targets.torch_lowering.attention import _bf16_attention
dtype = getattr(torch, sys.argv[1])
b,h,s,d = 1,12,128,64
def heads(x): return x.view(b,s,h,d).transpose(1,2)
q,k,v = (heads(torch.randn(b,s,h*d).to(dtype)) for _ in range(3)); kt = k.transpose(-1,-2)
tril = torch.tril(torch.ones(s,s,dtype=torch.bool))[None,None]
mask = torch.where(tril, torch.zeros(1,1,1,s), torch.full((1,1,1,s), -3e38))
for t in (1,2,1,2):
    torch.set_num_threads(t)
    tab = {}; run = oa.attend(0.125, tab, _bf16_attention(0.125))
    # keep the block's output alive: the primitives executed directly below write into it
    # (their memory objects hold the address of the last call's output)
    held = run(q,kt,v,mask)
    prims = [p for key,p in tab.items() if key != 'plans'][0]
    lib, stream = prims.rt.lib, prims.rt.stream
    ts = {i: [] for i in range(3)}; tot=[]
    for _ in range(200):
        for i,(prim,n,args) in enumerate(prims.steps):
            st=time.perf_counter(); lib.dnnl_primitive_execute(prim, stream, n, args); ts[i].append(time.perf_counter()-st)
        st=time.perf_counter(); held = run(q,kt,v,mask); tot.append(time.perf_counter()-st)
    print(sys.argv[1], 't%d'%t, prims.impls, ' '.join(f"{np.median(ts[i])*1e6:.0f}" for i in range(3)), 'us (mm1 softmax mm2), whole call', f"{np.median(tot)*1e6:.0f}")
