"""Per-layer fp16 against int8 / fp8 device time of ResNet-50 from a `quant_gpu.py --profile` JSON.

    python benchmarks/int8res_layers.py RESULTS.json [--md out.md] [--variants int8 ...]

`quant_gpu.py --profile` records every step's device time (`profile_runs`: each step between
two CUDA events, uncaptured) in program order. The convolution steps of the fp16 program (the
fused convolution + bias / residual / ReLU groups and the lone convolutions) and of an 8-bit
program (`quant_convolution` with its epilogue) come in the same order, ResNet-50's: the stem,
then per bottleneck block its 1x1 reduce, 3x3, and (first block of a stage) the 1x1 expansion
and the stride-s 1x1 shortcut taking the expansion as its residual, or (other blocks) the 1x1
expansion taking the block input as its residual. This pairs them and names each layer by
that structure; steps that are not convolutions (pooling, converts, `quantizelinear`, the
classifier) are listed apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: ResNet-50's stages: (blocks, width, stride of the first block)
STAGES = ((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2))


def resnet50_layers(size: int = 224) -> list[dict]:
    """ResNet-50's convolutions in program order (`module docstring`), each with a name, its
    geometry (C, H, C_out, k, stride) and the epilogue the programs fuse into it."""
    keys = ("name", "c", "h", "c_out", "k", "s", "ep")
    rows = [("stem 7x7/2", 3, size, 64, 7, 2, "bias relu")]
    c, h = 64, size // 4
    for stage, (blocks, width, stride) in enumerate(STAGES, start=1):
        for block in range(blocks):
            s = stride if block == 0 else 1
            tag, ho, wide = f"s{stage}b{block}", h // s, 4 * width
            rows.append((f"{tag} 1x1 reduce", c, h, width, 1, 1, "bias relu"))
            rows.append((f"{tag} 3x3", width, h, width, 3, s, "bias relu"))
            if block == 0:  # the expansion alone, then the shortcut taking it as residual
                rows.append((f"{tag} 1x1 expand", width, ho, wide, 1, 1, "-"))
                rows.append((f"{tag} 1x1 shortcut", c, h, wide, 1, s, "bias res relu"))
            else:
                rows.append((f"{tag} 1x1 expand", width, ho, wide, 1, 1, "bias res relu"))
            c, h = wide, ho
    return [dict(zip(keys, row, strict=True)) for row in rows]


def conv_steps(steps: list[dict], kind: str) -> tuple[list[dict], list[dict]]:
    """(the convolution steps, the others) of one variant's profiled steps in program order:
    fp16 `convolution` and its fused groups (those ending in a ReLU); 8-bit `quant_convolution`."""

    def is_conv(step: dict) -> bool:
        name = step["kind"]
        if kind == "fp16":
            return name == "convolution" or (name.startswith("pointwise[") and "relu" in name)
        return name.startswith("quant_convolution")

    return [s for s in steps if is_conv(s)], [s for s in steps if not is_conv(s)]


def table(results: dict, variants: list[str]) -> str:
    """The markdown table of ResNet-50's layers: fp16 us, each variant's us and ratio."""
    rows = {r["variant"]: r for r in results["rows"]}
    fp16, _ = conv_steps(rows["fp16"]["profile"]["steps"], "fp16")
    layers = resnet50_layers()
    if len(fp16) != len(layers):
        raise ValueError(f"fp16: {len(fp16)} convolution steps, ResNet-50 has {len(layers)}")
    others = {}
    cols = {}
    for v in variants:
        steps, rest = conv_steps(rows[v]["profile"]["steps"], v)
        if len(steps) != len(layers):
            raise ValueError(f"{v}: {len(steps)} convolution steps, ResNet-50 has {len(layers)}")
        cols[v], others[v] = steps, rest
    head = "| # | layer | C->C_out | HxW in | epilogue | fp16 us | " + " | ".join(
        f"{v} us | {v}/fp16" for v in variants
    )
    lines = [head + " |", "|" + "---|" * (6 + 2 * len(variants))]
    sums = {"fp16": 0.0, **{v: 0.0 for v in variants}}
    for i, (layer, f) in enumerate(zip(layers, fp16, strict=True)):
        cells = [str(i), layer["name"], f"{layer['c']}->{layer['c_out']}",
                 f"{layer['h']}", layer["ep"], f"{f['ms'] * 1e3:.1f}"]  # fmt: skip
        sums["fp16"] += f["ms"]
        for v in variants:
            ms = cols[v][i]["ms"]
            sums[v] += ms
            mark = " **" if ms > f["ms"] * 1.05 else ""
            cells += [f"{ms * 1e3:.1f}", f"{ms / f['ms']:.2f}{mark}"]
        lines.append("| " + " | ".join(cells) + " |")
    total = ["", "all convolutions", "", "", "", f"{sums['fp16'] * 1e3:.1f}"]
    for v in variants:
        total += [f"{sums[v] * 1e3:.1f}", f"{sums[v] / sums['fp16']:.3f}"]
    lines.append("| " + " | ".join(total) + " |")
    lines.append("")
    lines.append("Other steps (us per run):")
    for v in ["fp16", *variants]:
        rest = others.get(v) or conv_steps(rows[v]["profile"]["steps"], v)[1]
        by: dict[str, list[float]] = {}
        for s in rest:
            by.setdefault(s["kind"], []).append(s["ms"] * 1e3)
        parts = ", ".join(f"{k} x{len(t)} {sum(t):.1f}" for k, t in by.items())
        lines.append(f"- {v}: {parts}")
    return "\n".join(lines)


def by_class(results: dict, variant: str) -> str:
    """Sums per layer class (kernel size, stride, whether the residual is fused)."""
    rows = {r["variant"]: r for r in results["rows"]}
    fp16, _ = conv_steps(rows["fp16"]["profile"]["steps"], "fp16")
    q, _ = conv_steps(rows[variant]["profile"]["steps"], variant)
    acc: dict[str, list[float]] = {}
    for layer, f, s in zip(resnet50_layers(), fp16, q, strict=True):
        cls = f"{layer['k']}x{layer['k']}/{layer['s']} {layer['ep']}"
        a = acc.setdefault(cls, [0, 0.0, 0.0])
        a[0] += 1
        a[1] += f["ms"] * 1e3
        a[2] += s["ms"] * 1e3
    lines = [
        f"| class ({variant}) | n | fp16 us | {variant} us | gap us |",
        "|---|---|---|---|---|",
    ]
    for cls, (n, f, s) in sorted(acc.items(), key=lambda kv: kv[1][1] - kv[1][2]):
        lines.append(f"| {cls} | {n} | {f:.1f} | {s:.1f} | {s - f:+.1f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--md")
    ap.add_argument("--variants", nargs="+", default=None)
    args = ap.parse_args()
    data = json.loads(Path(args.results).read_text())
    res = next(r for r in data if r["model"] == "resnet50")
    names = [r["variant"] for r in res["rows"] if "profile" in r]
    variants = args.variants or [
        v for v in names if v != "fp16" and v.startswith(("int8", "fp8")) and "cudnn" not in v
    ]
    text = table(res, variants) + "\n\n" + "\n\n".join(by_class(res, v) for v in variants)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
