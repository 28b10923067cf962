"""GPT-2's products on oneDNN 3.2's matmul under the primitive attributes not tried before
(helper gpt17), alternating in one process: the weight's layout (`any`, the packed layout oneDNN
picks, as on main, against the plain row-major `ab`), the scratchpad (user-given, as on main,
against oneDNN's own `library` mode), and every implementation oneDNN offers for the product.

    PYTHONPATH=. python benchmarks/gpt17_gemm_attr.py --threads 1 --rounds 9 --calls 20

1 thread: thread CPU time; 2: wall time. Prints us a call, the median of rounds (each round the
best of `--calls`), GFLOP/s and the implementation's name. The variants are built by patching
`onednn_linear`'s module constants while each `Linear` is made (the module reads them there).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from pygraphx.targets.torch_lowering import onednn_capi as capi
from pygraphx.targets.torch_lowering import onednn_linear as ol
from pygraphx.targets.torch_lowering.onednn_linear import Linear


@contextlib.contextmanager
def patched(**values: int) -> Iterator[None]:
    old = {k: getattr(ol, k) for k in values}
    for k, v in values.items():
        setattr(ol, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(ol, k, v)


def offered(make: Callable[..., Linear]) -> list[str]:
    """The implementations oneDNN offers for the product `make()` builds (first: its pick)."""
    lin = make()
    prim = lin.primitive()
    rt = lin.rt
    names = [prim.impl]
    with capi.primitive_cache_off(rt.lib):
        while rt.next_impl(prim.pd):
            names.append(rt.impl_name(prim.pd))
    return names


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--impls", action="store_true", help="also every implementation offered")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    g = torch.Generator().manual_seed(0)
    m = a.rows
    x768 = torch.randn(m, 768, generator=g)
    x3072 = torch.randn(m, 3072, generator=g)
    r = torch.randn(m, 768, generator=g)
    w = {
        "qkv": (torch.randn(768, 2304, generator=g) * 0.03, torch.randn(2304, generator=g)),
        "up": (torch.randn(768, 3072, generator=g) * 0.03, torch.randn(3072, generator=g)),
        "down": (torch.randn(3072, 768, generator=g) * 0.03, torch.randn(768, generator=g)),
        "proj": (torch.randn(768, 768, generator=g) * 0.03, torch.randn(768, generator=g)),
    }
    kw = {"qkv": {"parts": 3}, "up": {"epilogue": "gelu_tanh"}, "down": {"residual": "sum"},
          "proj": {"residual": "sum"}}  # fmt: skip
    src = {"qkv": x768, "up": x768, "down": x3072, "proj": x768}
    settings = {
        "main": {},
        "plain ab weight": {"TAG_ANY": capi.TAG_AB},
        "library scratchpad": {"SCRATCHPAD_USER": 0},
    }
    variants: dict[str, Callable[[], object]] = {}
    impls: dict[str, str] = {}
    refs: dict[str, torch.Tensor] = {}
    for name in w:
        wt, b = w[name]
        for s, values in settings.items():
            if values.get("TAG_ANY") == capi.TAG_AB and name == "qkv":
                values = {"TAG_ANY": capi.TAG_ABC}  # (parts: a 3-D weight)
            with patched(**values):
                lin = Linear(wt, b, m, **kw[name])
            key = f"{name} {s}"
            impls[key] = lin.primitive().impl
            x = src[name]
            if name in ("down", "proj"):
                acc = r.clone()
                variants[key] = (lambda lin, x, acc: lambda: lin.into(x, acc))(lin, x, acc)
                out = lin.into(x, r.clone())
            else:
                variants[key] = (lambda lin, x: lambda: lin(x))(lin, x)
                out = lin(x)
            if name in refs:  # the variants compute the same product
                torch.testing.assert_close(out, refs[name], rtol=1e-4, atol=1e-4)
            refs.setdefault(name, out)
        if a.impls:
            for impl in offered(lambda wt=wt, b=b, name=name: Linear(wt, b, m, **kw[name]))[1:]:
                if impl.startswith("ref"):  # (seconds a call)
                    continue
                key = f"{name} impl {impl}"
                with contextlib.suppress(capi.OneDnnError):  # (an impl refusing the shape)
                    lin = Linear(wt, b, m, impl=impl, **kw[name])
                    impls[key] = lin.primitive().impl
                    x = src[name]
                    if name in ("down", "proj"):
                        acc = r.clone()
                        variants[key] = (lambda lin, x, acc: lambda: lin.into(x, acc))(
                            lin, x, acc)  # fmt: skip
                    else:
                        variants[key] = (lambda lin, x: lambda: lin(x))(lin, x)
    flops = {"qkv": 2 * m * 768 * 2304, "up": 2 * m * 768 * 3072, "down": 2 * m * 3072 * 768,
             "proj": 2 * m * 768 * 768}  # fmt: skip
    found: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for fn in variants.values():
        fn()
    for rnd in range(a.rounds):
        for k in names[:: 1 if rnd % 2 == 0 else -1]:
            best = float("inf")
            for _ in range(a.calls):
                t = clock()
                variants[k]()
                best = min(best, clock() - t)
            found[k].append(best)
    print(f"# {a.threads} thread(s), rows {m}, loadavg {open('/proc/loadavg').read().split()[:3]}")
    for k, v in found.items():
        us = float(np.median(v)) * 1e6
        gf = flops[k.split()[0]] / us / 1e3
        print(f"{k:40s} {us:9.1f} us  {gf:6.1f} GFLOP/s  {impls[k]}")


if __name__ == "__main__":
    main()
