"""Per-layer A/B of the Winograd kernel: this tree's against another git revision's (default
`main`), both against oneDNN's direct kernel, in one process.

    python benchmarks/wino2_ab.py --models resnet50 --batch 1 8 --threads 1 2 --flush-mb 4 64

The revision's `winograd.py` and `onednn_bmm.py` are loaded from git (`git show REF:path`)
as separate modules, so the two kernels run side by side on the same inputs. Each layer (bias
and relu, as in ResNet) is timed as the compile times candidates (`conv_choice.race`:
interleaved rounds, best of each, each call after a flush and the input written; one thread:
thread CPU time, else wall), with the flush of `conv_choice.FLUSH_BYTES` replaced by
`--flush-mb` (4: the compile's; 64: more than the 32 MiB L3, as in a network whose weights
stream through the caches every run). Both Winograd results are checked against oneDNN's.
"""

from __future__ import annotations

import subprocess
import sys
import types
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pygraphx  # noqa: E402,F401,I001  (first: pygraphx sets OpenMP's spin count before torch)
import torch  # noqa: E402

from benchmarks.wino_layers import (  # noqa: E402
    layer_args,
    layer_plan,
    resnet50_layers,
    zoo_layers,
)
from pygraphx.targets.torch_lowering import conv_choice, winograd  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import build_kernel  # noqa: E402
from pygraphx.targets.torch_lowering.malloc_keep import keep_freed_memory  # noqa: E402

LOWERING = "pygraphx/targets/torch_lowering"


def load_revision(ref: str) -> types.ModuleType:
    """`winograd.py` of git revision `ref` as a module, importing that revision's
    `onednn_bmm.py` (the rest of the package is this tree's)."""
    mods = {}
    for name in ("onednn_bmm", "winograd"):
        src = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ref}:{LOWERING}/{name}.py"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        src = src.replace(
            "from pygraphx.targets.torch_lowering.onednn_bmm import",
            "from _rev_onednn_bmm import",
        )
        mod = types.ModuleType(f"_rev_{name}")
        sys.modules[mod.__name__] = mod
        exec(compile(src, f"{ref}:{name}.py", "exec"), mod.__dict__)  # noqa: S102
        mods[name] = mod
    return mods["winograd"]


def time_layer(layer: tuple, batch: int, old: types.ModuleType) -> dict[str, float]:
    """Seconds per call of `dnnl`, the revision's and this tree's F(4,3) on `layer`."""
    (c, h, w), _k, _pad = layer
    plan, gen = layer_plan(layer, batch)
    x = torch.randn(batch, c, h, w, generator=gen).contiguous(memory_format=torch.channels_last)
    inputs = [x]
    fns = {
        "dnnl": build_kernel(plan, "dnnl", lambda: inputs[0], None),
        "old": old.build(plan, lambda: inputs[0], None, 4),
        "new": winograd.build(plan, lambda: inputs[0], None, 4),
    }
    ref = fns["dnnl"]()
    for name in ("old", "new"):
        err = float((fns[name]() - ref).abs().max() / ref.abs().max())
        assert err < 1e-4, f"{layer} {name}: relative difference {err:.1e} from dnnl"
    return conv_choice.race(fns, inputs)


def report(model: str, layers: Counter, batch: int, threads: int, flush_mb: int, old) -> None:
    """Time every layer and print one markdown table."""
    conv_choice.FLUSH_BYTES = flush_mb << 20
    print(f"\n### {model} b{batch}, {threads} thread(s), flush {flush_mb} MiB, ms per call\n")
    print("| layer (C, H, W) -> K | n | dnnl | old | new | new/old | new/dnnl |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    total: Counter = Counter()
    for layer, count in sorted(layers.items(), key=lambda kv: -kv[0][0][1]):
        t = time_layer(layer, batch, old)
        for name, sec in t.items():
            total[name] += sec * count
        cells = " | ".join(f"{t[n] * 1e3:.3f}" for n in ("dnnl", "old", "new"))
        print(f"| {layer[0]} -> {layer[1]} | {count} | {cells} | {t['new'] / t['old']:.2f} "
              f"| {t['new'] / t['dnnl']:.2f} |", flush=True)  # fmt: skip
    cells = " | ".join(f"{total[n] * 1e3:.2f}" for n in ("dnnl", "old", "new"))
    print(f"| **sum x n** | | {cells} | {total['new'] / total['old']:.2f} "
          f"| {total['new'] / total['dnnl']:.2f} |")  # fmt: skip


def main() -> None:
    ap = layer_args(__doc__)
    ap.add_argument("--flush-mb", nargs="+", type=int, default=[4])
    ap.add_argument("--ref", default="main", help="the git revision to compare with")
    ap.add_argument("--min-channels", type=int, default=0, help="only layers this wide")
    args = ap.parse_args()
    keep_freed_memory()  # as the cpu target does when it lowers a convolution
    old = load_revision(args.ref)
    for model in args.models:
        layers = resnet50_layers() if model == "resnet50" else zoo_layers(model)
        layers = Counter({k: v for k, v in layers.items()
                          if min(k[0][0], k[1]) >= args.min_channels})  # fmt: skip
        for batch in args.batch:
            for threads in args.threads:
                torch.set_num_threads(threads)
                for flush_mb in args.flush_mb:
                    report(model, layers, batch, threads, flush_mb, old)


if __name__ == "__main__":
    main()
