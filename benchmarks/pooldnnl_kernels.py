"""The pooling kernels alone, warm (called back to back): oneDNN's primitive (`onednn_pool`)
against torch's kernel, float32 and bf16, on the pooling shapes of MobileNetV2, ResNet-50 and
YOLOv8n at batch 1, channels-last.

    PYTHONPATH=. python benchmarks/pooldnnl_kernels.py --threads 1 --n 300

Thread CPU time per call (`time.thread_time`), after 20 calls of warm-up; malloc keeps freed
memory as the cpu target sets it (`malloc_keep`), so torch's new output each call reuses the
last one's pages. In a run the steps cost more (cold code: `pooldnnl_ab.py`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pygraphx.targets.torch_lowering import malloc_keep, onednn_pool  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_capi import (  # noqa: E402
    POOLING_AVG_EXCLUDE,
    POOLING_MAX,
    runtime,
)

# name -> (algorithm, input lens, output lens, kernel, stride, padding)
CASES = {
    "mnv2_global_avg": (POOLING_AVG_EXCLUDE, (1, 1280, 7, 7), (1, 1280, 1, 1), (7, 7), (1, 1), 0),
    "r50_global_avg": (POOLING_AVG_EXCLUDE, (1, 2048, 7, 7), (1, 2048, 1, 1), (7, 7), (1, 1), 0),
    "r50_stem_max3s2": (POOLING_MAX, (1, 64, 112, 112), (1, 64, 56, 56), (3, 3), (2, 2), 1),
    "yolo_sppf_max5": (POOLING_MAX, (1, 128, 20, 20), (1, 128, 20, 20), (5, 5), (1, 1), 2),
}


def per_call(fn: object, n: int) -> float:
    """Microseconds of thread CPU per call of `fn` over `n` calls."""
    start = time.thread_time()
    for _ in range(n):
        fn()  # type: ignore[operator]
    return (time.thread_time() - start) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--n", type=int, default=300)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    malloc_keep.keep_freed_memory()
    rt = runtime()
    if rt is None:
        raise SystemExit("oneDNN's C API library is not available")
    cl = torch.channels_last
    for name, (alg, x_lens, out_lens, kernel, stride, pad) in CASES.items():
        for dtype in (torch.float32, torch.bfloat16):
            plan = onednn_pool.PoolPlan(alg, x_lens, out_lens, kernel, stride, (0, 0),
                                        (pad, pad), (pad, pad), dtype)  # fmt: skip
            pool = onednn_pool.Pool(rt, plan)
            x = torch.randn(x_lens).to(dtype).contiguous(memory_format=cl)
            y = torch.empty(out_lens, dtype=dtype).contiguous(memory_format=cl)
            if alg == POOLING_MAX:

                def ref(x: torch.Tensor = x, k: tuple = kernel, s: tuple = stride, q: int = pad):
                    return F.max_pool2d(x, k, s, q)
            else:

                def ref(x: torch.Tensor = x):
                    return torch.mean(x, (2, 3), keepdim=True)

            pool(x, y)
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            torch.testing.assert_close(y.float(), ref().float(), rtol=tol, atol=tol)
            for _ in range(20):
                pool(x, y)
                ref()
            ours, theirs = per_call(lambda: pool(x, y), args.n), per_call(ref, args.n)  # noqa: B023
            impl = next(iter(pool.made.values())).impl
            print(f"{name:17s} {str(dtype):15s} oneDNN ({impl}) {ours:7.1f} us  "
                  f"torch {theirs:7.1f} us")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
