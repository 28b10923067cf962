"""Micro (helper gemm14): the native layer-norm kernel against torch.layer_norm, warm.

    PYTHONPATH=. python benchmarks/gemm14_ln_micro.py
"""
import ctypes, torch, time
from pygraphx.targets import native
lib = native.load("layernorm")
lib.ln_supported.restype = ctypes.c_int; lib.ln_bf16_supported.restype = ctypes.c_int
print("supported", lib.ln_supported(), lib.ln_bf16_supported())
P, I = ctypes.c_void_p, ctypes.c_int64
lib.ln_f32.argtypes = [P, P, P, P, P, I, I, I, I, I, ctypes.c_float, I]
lib.ln_f32.restype = ctypes.c_int
for shape, th in (((128, 768), 1), ((1024, 384), 1), ((37, 45), 2), ((128,768),2)):
    torch.set_num_threads(th)
    x = torch.randn(shape) * 3 + 1; w = torch.randn(shape[1]); b = torch.randn(shape[1])
    y = torch.empty(shape); yb = torch.empty(shape, dtype=torch.bfloat16)
    rc = lib.ln_f32(x.data_ptr(), y.data_ptr(), yb.data_ptr(), w.data_ptr(), b.data_ptr(), shape[0], shape[1], shape[1], shape[1], shape[1], 1e-12, th)
    ref = torch.nn.functional.layer_norm(x.double(), (shape[1],), w.double(), b.double(), 1e-12)
    print(shape, rc, (y.double()-ref).abs().max().item(), torch.equal(yb, y.to(torch.bfloat16)))
    args = (x.data_ptr(), y.data_ptr(), None, w.data_ptr(), b.data_ptr(), shape[0], shape[1], shape[1], shape[1], shape[1], 1e-12, th)
    clock = time.thread_time_ns if th == 1 else time.perf_counter_ns
    for name, fn in (("native", lambda: lib.ln_f32(*args)), ("torch", lambda: torch.layer_norm(x, (shape[1],), w, b, 1e-12))):
        for _ in range(20): fn()
        T = []
        for _ in range(200):
            s = clock(); fn(); T.append(clock() - s)
        T.sort(); print("  ", name, "warm median us", T[100]/1e3)
