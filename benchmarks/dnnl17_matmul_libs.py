"""oneDNN 3.2 (the venv's `onednn-cpu-gomp`) against oneDNN 3.13 (PyPI `onednn==2026.1.0`:
its CPU engine is SYCL on Intel's OpenCL CPU runtime, TBB threads inside) on GPT-2's and
MiniLM's fixed-weight products, through our C-API `onednn_linear.Linear` (helper dnnl17, probe
only; notes benchmarks/results/dnnl17.md).

A process loads one library (`PGX_ONEDNN_LIB`); `--driver` runs worker processes alternating
the two libraries (both orders), each pinned to one core (`taskset -c 0`: oneDNN 3.2 with
torch.set_num_threads(1) on the caller's thread; 3.13's SYCL queue runs the kernel on the
OpenCL runtime's worker thread, on the same core, so thread CPU time means nothing for it: the
figures are wall time of execute + `dnnl_stream_wait`, or `--clock proc_us`, process CPU time).

    # worker (one library):
    PGX_ONEDNN_LIB=/path/libdnnl.so.3 PYTHONPATH=. taskset -c 0 python \
        benchmarks/dnnl17_matmul_libs.py --calls 15
    # driver (3.13 needs its NEEDED libraries on LD_LIBRARY_PATH: /tmp/dnnl17/env.sh):
    PYTHONPATH=. python benchmarks/dnnl17_matmul_libs.py --driver --reps 3 \
        --lib-a /work/main/.venv/lib/libdnnl.so.3 \
        --lib-b /tmp/onednn26/x/onednn-2026.1.0.data/data/lib/libdnnl.so.3

Worker: per shape and type, the best wall / process-CPU / thread-CPU time of `--calls` calls
(after 2 warm-up calls), GFLOP/s, the implementation's name; one JSON line per product.
Driver: the best over its processes per library (`--clock`), and the ratio 3.13 / 3.2 in
speed (> 1: 3.13 faster); the workers' lines are appended to `--log`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = {
    "gpt2 qkv": (128, 768, 2304),
    "gpt2 proj": (128, 768, 768),
    "gpt2 up": (128, 768, 3072),
    "gpt2 down": (128, 3072, 768),
    "gpt2 lm_head": (128, 768, 50257),
    "minilm qkv": (1024, 384, 1152),
    "minilm up": (1024, 384, 1536),
    "minilm down": (1024, 1536, 384),
}


class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint),
                ("gpu_runtime", ctypes.c_uint)]  # fmt: skip


def worker(calls: int, only: list[str]) -> None:
    import torch

    from pygraphx.targets.torch_lowering import onednn_capi as capi
    from pygraphx.targets.torch_lowering.onednn_linear import Linear

    torch.set_num_threads(1)
    lib = capi.library()
    if lib is None:
        raise SystemExit(f"no oneDNN: {capi.unavailable_reason()}")
    lib.dnnl_version.restype = ctypes.POINTER(Version)
    # oneDNN 3.13 from PyPI runs its CPU engine on SYCL (OpenCL CPU device): execution is
    # asynchronous, on the OpenCL runtime's TBB threads. Every execute (the weight's reorder
    # included) is followed by `dnnl_stream_wait`, for both libraries alike.
    rt = capi.runtime()
    assert rt is not None
    execute, wait = lib.dnnl_primitive_execute, lib.dnnl_stream_wait
    wait.restype, wait.argtypes = ctypes.c_int, [ctypes.c_void_p]

    def execute_wait(*args: object) -> int:
        status = execute(*args)
        capi.check(wait(rt.stream), "stream_wait")
        return status

    lib.dnnl_primitive_execute = execute_wait
    v = lib.dnnl_version().contents
    ver = f"{v.major}.{v.minor}.{v.patch} cpu_runtime={v.cpu_runtime}"
    g = torch.Generator().manual_seed(0)
    for name, (m, k, n) in SHAPES.items():
        if only and not any(o in name for o in only):
            continue
        for dt in (torch.float32, torch.bfloat16):
            w = (torch.randn(k, n, generator=g) * 0.03).to(dt)
            b = torch.randn(n, generator=g).to(dt)
            x = torch.randn(m, k, generator=g).to(dt)
            lin = Linear(w, b, m)
            ref = (x.float() @ w.float() + b.float())
            y = lin(x)
            err = float((y.float() - ref).abs().max() / ref.abs().max())
            lin(x)
            best_t = best_p = best_w = float("inf")
            for _ in range(calls):
                t0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
                lin(x)
                w1, p1, t1 = time.perf_counter(), time.process_time(), time.thread_time()
                best_t, best_p = min(best_t, t1 - t0), min(best_p, p1 - p0)
                best_w = min(best_w, w1 - w0)
            flop = 2.0 * m * k * n
            print(json.dumps({"lib": ver, "shape": name, "mkn": [m, k, n], "dtype": str(dt)[6:],
                              "thread_us": best_t * 1e6, "proc_us": best_p * 1e6,
                              "wall_us": best_w * 1e6,
                              "gflops_wall": flop / best_w / 1e9, "impl": lin.primitive().impl,
                              "rel_err": err}), flush=True)  # fmt: skip
            del lin, w, x


def driver(a: argparse.Namespace) -> None:
    libs = {"3.2": a.lib_a, "3.13": a.lib_b}
    got: dict[tuple[str, str, str], list[float]] = {}
    impls: dict[tuple[str, str, str], str] = {}
    for rep in range(a.reps):
        order = ["3.2", "3.13"] if rep % 2 == 0 else ["3.13", "3.2"]
        for tag in order:
            env = dict(os.environ, PGX_ONEDNN_LIB=libs[tag], PYTHONPATH=".")
            cmd = ["taskset", "-c", "0", sys.executable, __file__, "--calls", str(a.calls)]
            cmd += [f"--only={o}" for o in a.only]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            with open(a.log, "a") as f:
                f.write(out)
            for line in out.splitlines():
                r = json.loads(line)
                key = (tag, r["shape"], r["dtype"])
                got.setdefault(key, []).append(r[a.clock])
                impls[key] = r["impl"]
            print(f"# rep {rep} {tag} done {time.strftime('%H:%M:%S')}", flush=True)
    print(f"{'shape':14} {'type':8} {'3.2 us':>9} {'3.13 us':>9} {'3.2 GF/s':>9} "
          f"{'3.13 GF/s':>9} {'3.13/3.2':>8}  runs-3.2 / runs-3.13 (us)  impls")  # fmt: skip
    for name, (m, k, n) in SHAPES.items():
        for dt in ("float32", "bfloat16"):
            a2, b2 = got.get(("3.2", name, dt)), got.get(("3.13", name, dt))
            if not a2 or not b2:
                continue
            flop = 2.0 * m * k * n
            ta, tb = min(a2), min(b2)
            runs = f"{[round(t) for t in a2]} / {[round(t) for t in b2]}"
            print(f"{name:14} {dt:8} {ta:9.0f} {tb:9.0f} {flop / ta / 1e3:9.1f} "
                  f"{flop / tb / 1e3:9.1f} {ta / tb:8.3f}  {runs}  "
                  f"{impls[('3.2', name, dt)]} | {impls[('3.13', name, dt)]}")  # fmt: skip
    med = statistics.median
    ratios = [
        f"{s}/{d[:4]} {med(got[('3.2', s, d)]) / med(got[('3.13', s, d)]):.3f}"
        for s in SHAPES
        for d in ("float32", "bfloat16")
        if ("3.2", s, d) in got and ("3.13", s, d) in got
    ]
    print("(medians of per-process bests: ratio 3.13/3.2 in speed per product: "
          + ", ".join(ratios) + ")")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", action="store_true")
    ap.add_argument("--log", default="/tmp/dnnl17/runs.jsonl", help="the workers' JSON lines")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--clock", default="wall_us", choices=["wall_us", "proc_us", "thread_us"])
    ap.add_argument("--lib-a", default=os.path.join(sys.prefix, "lib", "libdnnl.so.3"))
    ap.add_argument("--lib-b", default="/tmp/onednn26/x/onednn-2026.1.0.data/data/lib/libdnnl.so.3")
    a = ap.parse_args()
    if a.driver:
        driver(a)
    else:
        worker(a.calls, a.only)


if __name__ == "__main__":
    main()
