"""Micro (helper norms18): the native layer-norm kernel's entry points `ln_f32` (v1) and
`ln_f32_v2` against each other (and torch.layer_norm), alternating in one process; warm (the
same input each call) and `--cold` (a 16 MiB buffer written before each call, as a weight
product would leave the caches). One thread: thread CPU time; more: wall time.

    PYTHONPATH=. python benchmarks/norms18_ln_micro.py --threads 1 --rounds 15
"""
import argparse
import ctypes
import time

import torch

ENTRY = {"v1": "ln_f32", "v2": "ln_f32_v2"}
NAMES = list(ENTRY)

from pygraphx.targets.torch_lowering import native_layernorm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--inplace", action="store_true", help="y = x (errors then meaningless)")
    ap.add_argument("--shapes", nargs="+", default=["1024x384", "128x768", "1024x768", "37x45"])
    args = ap.parse_args()
    th = args.threads
    torch.set_num_threads(th)
    lib = native_layernorm.library()
    clock = time.thread_time_ns if th == 1 else time.perf_counter_ns
    junk = torch.empty(4 << 20)
    for text in args.shapes:
        r, n = (int(v) for v in text.split("x"))
        x = torch.randn(r, n) * 3 + 1
        w, b = torch.randn(n), torch.randn(n)
        ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-12)
        ys = {}
        fns = {}
        for name in NAMES:
            y = x if args.inplace else torch.empty(r, n)
            fn = getattr(lib, ENTRY[name])
            fn.argtypes, fn.restype = lib.ln_f32.argtypes, lib.ln_f32.restype
            a = (x.data_ptr(), y.data_ptr(), None, w.data_ptr(), b.data_ptr(), r, n, n, n, n,
                 ctypes.c_float(1e-12), th)
            fns[name] = (fn, a)
            ys[name] = y
            assert fn(*a) == 0
        errs = {k: float((v.double() - ref).abs().max()) for k, v in ys.items()}
        T = {k: [] for k in fns}
        for rd in range(args.rounds):
            order = list(fns) if rd % 2 == 0 else list(fns)[::-1]
            for k in order:
                fn, a = fns[k]
                best = []
                for _ in range(args.calls):
                    if args.cold:
                        junk.fill_(rd)
                    s = clock()
                    fn(*a)
                    best.append(clock() - s)
                best.sort()
                T[k].append(best[len(best) // 2])
        med = {k: sorted(v)[len(v) // 2] / 1e3 for k, v in T.items()}
        print(f"{text:>9} t{th} {'cold' if args.cold else 'warm'}"
              f"{' in place' if args.inplace else ''}: "
              + ", ".join(f"{k} {med[k]:.2f} us ({med[k] / med['v1']:.3f})" for k in NAMES)
              + "; max err vs f64 " + " ".join(f"{k} {errs[k]:.2e}" for k in NAMES), flush=True)


if __name__ == "__main__":
    main()
