"""chainfix17: is the stamped native block chain (`mbconv_chain_stamped`, stamps NULL: a plain
run) as fast as the chain before it (`mbconv_chain_run` of an older revision)?

Builds `kernels/mbconv.c` + `mbconv_bf16.c` of two git revisions with the native compiler's
flags (`compiler.BASE_FLAGS`) into a temporary folder, compiles MobileNetV2 b1 for the cpu
target (`--threads`, every step at that count, load and stall adaptation off), runs it once and
then calls its chain's C function directly with the same arguments, the old build's
`mbconv_chain_run` and the new build's `mbconv_chain_stamped` (NULL stamps), in blocks of
`--calls` calls alternating (the order reversed every block), one process:

    python benchmarks/chainfix17_stamps_ab.py --threads 1 [--old 98f0425] [--new HEAD]
        [--blocks 16] [--calls 30]

Printed: each block's median ms per call and the median / minimum over blocks; 1 thread:
the calling thread's CPU time (`time.thread_time`), more threads: wall time.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KERNELS = "pygraphx/targets/native/kernels"


def build(rev: str, folder: Path) -> ctypes.CDLL:
    """The mbconv library of git revision `rev`, built with the native compiler's flags."""
    from pygraphx.targets.native.compiler import BASE_FLAGS

    src = folder / f"mbconv-{rev}.c"
    text = "".join(
        subprocess.run(["git", "show", f"{rev}:{KERNELS}/{part}.c"], cwd=ROOT, check=True,
                       capture_output=True, text=True).stdout
        for part in ("mbconv", "mbconv_bf16")
    )  # fmt: skip
    src.write_text(text)
    out = folder / f"mbconv-{rev}.so"
    subprocess.run(["gcc", *BASE_FLAGS, str(src), "-o", str(out)], check=True)
    return ctypes.CDLL(str(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--old", default="98f0425")
    ap.add_argument("--new", default="HEAD")
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    os.environ["PGX_CPU_LOAD_ADAPT"] = "0"
    os.environ["PGX_CPU_STALL_ADAPT"] = "0"
    import torch

    import pygraphx
    from pygraphx.models import get_model, model_inputs
    from pygraphx.targets.cpu.target import CpuTarget
    from pygraphx.targets.torch_lowering.native_mbchain import MbChain

    nt = args.threads
    model = get_model("mobilenetv2", batch=1)
    feeds = model_inputs("mobilenetv2", model)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=nt, step_threads=False))
    prog.run(feeds)
    chain = next(c for c in prog._executable.chained.chains if isinstance(c, MbChain))
    torch.set_num_threads(nt)
    chain.run()  # (everything pointed to; the direct calls reuse the arguments)
    print(f"chain: {len(chain)} members at {chain.threads} thread(s)")
    V = ctypes.c_void_p
    with tempfile.TemporaryDirectory() as tmp:
        old = build(args.old, Path(tmp)).mbconv_chain_run
        old.argtypes, old.restype = [V, ctypes.c_int64, V], ctypes.c_int
        new = build(args.new, Path(tmp)).mbconv_chain_stamped
        new.argtypes, new.restype = [V, ctypes.c_int64, V, V], ctypes.c_int
        clock = time.thread_time if nt == 1 else time.perf_counter
        call = chain._call

        def block(fn, fargs) -> float:  # noqa: ANN001
            spent = []
            for _ in range(args.calls):
                start = clock()
                if fn(*fargs) != 0:
                    raise RuntimeError("the chain function failed")
                spent.append(clock() - start)
            return statistics.median(spent) * 1e3

        olds, news = [], []
        for r in range(args.blocks):
            if r % 2:
                olds.append(block(old, call))
                news.append(block(new, (*call, None)))
            else:
                news.append(block(new, (*call, None)))
                olds.append(block(old, call))
    kind = "thread CPU" if nt == 1 else "wall"
    print(f"{nt} thread(s), {kind} ms a chain call (median of {args.calls}), {args.blocks} blocks:")
    for name, xs in (("old", olds), ("new", news)):
        print(f" {name} " + " ".join(f"{x:.3f}" for x in xs)
              + f" | median {statistics.median(xs):.3f} min {min(xs):.3f}")  # fmt: skip
    print(f" new/old: median {statistics.median(news) / statistics.median(olds):.3f}, "
          f"min {min(news) / min(olds):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
