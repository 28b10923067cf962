"""The float32 block kernel before / after bfmb16's change to `mbconv.c` (the depthwise
`depthwise_ch` with a channel range and a bf16 store, inlined): both builds in one process,
the same `MbConv` arguments, alternating blocks of 30 calls, 8 rounds, the order reversed
every round; median us a call (1 thread: thread CPU time, else wall); outputs must be equal.

    python benchmarks/bfmb16_f32_kernel_ab.py THREADS [OLD_REV]   (OLD_REV default 7accf36)
"""
import subprocess
from pathlib import Path

import ctypes, time, sys, torch, numpy as np  # noqa: E401
from pygraphx.targets.torch_lowering import native_mbconv as nm

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))
from benchmarks.scratch import scratch_dir  # noqa: E402

_KERNELS = _ROOT / "pygraphx/targets/native/kernels"
_TMP = scratch_dir("pgx-bench-bfmb16-")
_REV = sys.argv[2] if len(sys.argv) > 2 else "7accf36"
(_TMP / "old.c").write_text(subprocess.run(
    ["git", "show", f"{_REV}:pygraphx/targets/native/kernels/mbconv.c"], cwd=_ROOT,
    check=True, capture_output=True, text=True).stdout)
(_TMP / "new.c").write_text((_KERNELS / "mbconv.c").read_text()
                            + (_KERNELS / "mbconv_bf16.c").read_text())
for _n in ("old", "new"):
    subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o",
                    str(_TMP / f"{_n}.so"), str(_TMP / f"{_n}.c")], check=True)
thr = int(sys.argv[1]); torch.set_num_threads(thr)
libs = {}
for n in ("old", "new"):
    l = ctypes.CDLL(str(_TMP / f"{n}.so")); l.mbconv_run.argtypes = [ctypes.POINTER(nm._Args)]; l.mbconv_run.restype = ctypes.c_int
    libs[n] = l.mbconv_run
clock = time.thread_time if thr == 1 else time.perf_counter
shapes = [(1,16,112,112,96,24,2),(1,24,56,56,144,24,1),(1,24,56,56,144,32,2),(1,64,14,14,384,64,1),(1,160,7,7,960,160,1),(8,32,28,28,192,32,1)]
tot = {"old": 0.0, "new": 0.0}
for (n,c,h,w,m,k,s) in shapes:
    res = s == 1 and c == k
    mb = nm.MbConv(torch.randn(m,c,1,1), torch.randn(m), torch.randn(m,1,3,3), torch.randn(m), torch.randn(k,m,1,1), torch.randn(k), s, [("hardtanh",[0.,6.])]*2+[("none",[])], [n,c,h,w], res)
    x = torch.randn(n,c,h,w).contiguous(memory_format=torch.channels_last)
    ho=(h-1)//s+1
    y = torch.empty(n,k,ho,ho).contiguous(memory_format=torch.channels_last)
    r = torch.randn(n,k,ho,ho).contiguous(memory_format=torch.channels_last) if res else None
    outs = {}
    best = {"old": [], "new": []}
    for rnd in range(8):
        for name in (("old","new") if rnd % 2 == 0 else ("new","old")):
            mb._run = libs[name]
            mb(x, y, r)
            t0 = clock()
            for _ in range(30): mb(x, y, r)
            best[name].append((clock()-t0)/30*1e6)
            outs[name] = y.clone()
    assert torch.equal(outs["old"], outs["new"])
    mo, mn = np.median(best["old"]), np.median(best["new"])
    tot["old"] += mo; tot["new"] += mn
    print((n,c,h,w,m,k,s), f"old {mo:.1f} new {mn:.1f} us new/old {mn/mo:.3f}")
print("sum", {k: round(v,1) for k,v in tot.items()}, f"{tot['new']/tot['old']:.3f}")
