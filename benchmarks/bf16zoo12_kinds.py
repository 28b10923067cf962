"""A zoo model at bf16 or f32: pygraphx's steps by kind against OpenVINO's PERF_COUNT layers.

    PYTHONPATH=. python benchmarks/bf16zoo12_kinds.py --model unet_small --threads 2 --runs 20
    PYTHONPATH=. python benchmarks/bf16zoo12_kinds.py --model minilm --threads 2 --runs 20
    PYTHONPATH=. python benchmarks/bf16zoo12_kinds.py --model minilm --precision f32

`--precision f32` (helper minilm13): pygraphx unquantised and OpenVINO at
INFERENCE_PRECISION_HINT f32; the default (bf16) is as below.

pygraphx: `quantize_bf16` (its default "products" policy, what `cpu_vs_peers.py --bf16` runs),
the cpu target's fast-path steps timed as they run (`mnv2dw_layers.ours`: mean wall ms of each
step over `--runs` runs, each step's best of `--blocks` blocks), grouped by the step's ops
(its non-literal instructions' op names, joined). OpenVINO at INFERENCE_PRECISION_HINT bf16
with PERF_COUNT (`mnv2dw_layers.openvino_rows`: each executed layer's median `real_time`),
grouped by (layer type, kernel). Each side's whole-run wall (median of `--runs * --blocks` runs
after 5 warm-ups) against its steps' / layers' sum. The per-step timing adds a clock read
around each step, so the sum of steps can run a little above the plain wall.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx  # noqa: E402

from benchmarks.mnv2dw_layers import openvino_rows, ours  # noqa: E402
from benchmarks.zoo import SIZES, zoo_model  # noqa: E402


def by_kind(rows: list[dict], key: object) -> list[tuple[str, int, float]]:
    """(kind, count, ms) sorted by ms, largest first."""
    acc: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        acc[key(r)].append(r["ms"])
    return sorted(((k, len(v), sum(v)) for k, v in acc.items()), key=lambda t: -t[2])


def our_kind(r: dict) -> str:
    """A step's ops, with a convolution's kernel size (and 'dw' when grouped) appended."""
    m = re.search(r"w\[(\d+), (\d+), (\d+), (\d+)\] s\[([\d, ]+)\] g(\d+)", r["layer"])
    if not m:
        return r["ops"]
    k = f"{m[3]}x{m[4]}" + (" dw" if int(m[6]) > 1 else "") + (" s2" if "2" in m[5] else "")
    return f"{r['ops']} [{k}]"


def conv_descs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, str]:
    """ONNX Conv node name -> `mnv2dw_layers.ours`' layer text (x, w, stride, group). The
    convolutions' input shapes from one ONNX Runtime run with them made graph outputs (onnx's
    shape inference loses them after the exports' Split / Resize); OpenVINO names a
    convolution layer after its ONNX node (+ '/WithoutBiases')."""
    import onnxruntime as ort

    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    xs = list(dict.fromkeys(n.input[0] for n in convs if n.input[0] not in have))
    probe.graph.output.extend(onnx.ValueInfoProto(name=x) for x in xs)
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    shapes = {n: list(v.shape) for n, v in zip(names, sess.run(None, feeds), strict=True)}
    shapes.update({k: list(v.shape) for k, v in feeds.items()})
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    out = {}
    for n in convs:
        a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
        w = inits[n.input[1]]
        stride = list(a.get("strides", [1] * (len(w) - 2)))
        out[n.name] = f"x{shapes[n.input[0]]} w{w} s{stride} g{a.get('group', 1)}"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=tuple(SIZES))
    p.add_argument("--size", default="full", choices=("full", "test"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--precision", default="bf16", choices=("bf16", "f32"))
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    path, feeds = zoo_model(args.model, args.size)
    feeds = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
    model = onnx.load(str(path))
    print(f"# {args.model} ({SIZES[args.model][args.size]}) threads {args.threads} "
          f"{args.precision}")
    print("# loadavg at the start:", Path("/proc/loadavg").read_text().split()[:3])
    mine = ours(model, args.threads, feeds, args.runs, args.blocks,
                bf16=args.precision == "bf16")
    our_wall = mine.pop()["ms"]
    ov = openvino_rows(model, args.threads, feeds, args.runs * args.blocks, args.precision)
    ov_wall = ov.pop()["ms"]
    ours_k = by_kind(mine, our_kind)
    ov_k = by_kind(ov, lambda r: f"{r['op']} / {r['impl']}")
    our_sum = sum(r["ms"] for r in mine)
    ov_sum = sum(r["ms"] for r in ov)
    print(f"\npygraphx: wall {our_wall:.2f} ms, steps' sum {our_sum:.2f} ms "
          f"({sum(1 for r in mine if r['ms'] > 0)} steps), outside {our_wall - our_sum:.2f}")
    print(f"openvino: wall {ov_wall:.2f} ms, layers' sum {ov_sum:.2f} ms ({len(ov)} layers), "
          f"outside {ov_wall - ov_sum:.2f}")
    print(f"\npygraphx steps by ops (top {args.top}): count, ms, % of sum")
    for k, n, ms in ours_k[: args.top]:
        print(f"  {ms:9.3f} {n:4d} {100 * ms / our_sum:5.1f}%  {k}")
    print(f"\nopenvino {args.precision} layers by type / kernel (top {args.top}): count, ms, "
          "% of sum")
    for k, n, ms in ov_k[: args.top]:
        print(f"  {ms:9.3f} {n:4d} {100 * ms / ov_sum:5.1f}%  {k}")
    our_convs = [r for r in mine if "convolution" in r["ops"]]
    ov_convs = [r for r in ov if r["op"] == "Convolution"]
    if our_convs:
        descs = conv_descs(model, feeds)
        mine_d: dict[str, list[float]] = defaultdict(list)
        ov_d: dict[str, list[float]] = defaultdict(list)
        impl: dict[str, str] = {}
        for r in our_convs:
            mine_d[r["layer"].replace(" (fused with the one before)", "")].append(r["ms"])
        for r in ov_convs:
            d = descs.get(r["name"].removesuffix("/WithoutBiases"), f"? {r['name']}")
            ov_d[d].append(r["ms"])
            impl[d] = r["impl"]
        print(f"\nconvolutions paired by shape ({len(our_convs)} ours, {len(ov_convs)} ov): the"
              " largest gaps, ours - ov ms, ours ms, ov ms, count ours/ov, layer, ov kernel")
        keys = set(mine_d) | set(ov_d)
        gaps = sorted(keys, key=lambda k: sum(ov_d[k]) - sum(mine_d[k]))
        for k in gaps[: args.top]:
            a, b = sum(mine_d[k]), sum(ov_d[k])
            print(f"  {a - b:+8.3f} {a:8.3f} {b:8.3f} {len(mine_d[k])}/{len(ov_d[k])}  {k}"
                  f" {impl.get(k, '')}")
        print(f"  sum ours {sum(r['ms'] for r in our_convs):.3f}"
              f" ov {sum(r['ms'] for r in ov_convs):.3f}")
    print("\n# loadavg at the end:", Path("/proc/loadavg").read_text().split()[:3])
    if args.json:
        Path(args.json).write_text(json.dumps({"ours": mine, "ov": ov, "our_wall": our_wall,
                                               "ov_wall": ov_wall}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
