"""MiniLM's bf16 products and attention by role, from `bf16zoo12_kinds.py --model minilm --json`.

    PYTHONPATH=. python benchmarks/bf16zoo12_kinds.py --model minilm --json /tmp/minilm.json
    PYTHONPATH=. python benchmarks/bf16zoo12_minilm_roles.py /tmp/minilm.json

OpenVINO's FullyConnected / Subgraph / Transpose / Reorder layers summed by name over the
encoder layers (`layer.N`); ours: the `dot+pointwise` steps in run order (out-proj, FFN1, FFN2
in each encoder layer), the fused QKV step, the attention step, the layernorm steps.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict


def main(path: str) -> int:
    j = json.load(open(path))
    acc: dict[tuple, list[float]] = defaultdict(list)
    for r in j["ov"]:
        if r["op"] in ("FullyConnected", "Subgraph", "Transpose", "Reorder"):
            acc[(r["op"], r["impl"], re.sub(r"layer\.\d+", "layer.N", r["name"]))].append(r["ms"])
    print("ov by name (sum ms, n):")
    for k, v in sorted(acc.items(), key=lambda t: -sum(t[1]))[:16]:
        print(f"  {sum(v):7.3f} {len(v)} {k}")
    ours = j["ours"]
    dp = [r["ms"] for r in ours if r["ops"] == "dot+pointwise"]
    if len(dp) % 3:
        raise ValueError(f"{len(dp)} dot+pointwise steps, not 3 per encoder layer")
    print("ours dot+pointwise by position: out-proj %.3f, FFN1 %.3f, FFN2 %.3f"
          % tuple(sum(dp[i::3]) for i in range(3)))
    print("ours QKV %.3f, attention %.3f, layernorms %.3f" % (
        sum(r["ms"] for r in ours if r["ops"] == "dot+pointwise+slice+reshape+transpose"),
        sum(r["ms"] for r in ours if r["ops"].startswith("dot+fused_reduce")),
        sum(r["ms"] for r in ours if "reduce_mean" in r["ops"])))
    print(f"walls: ours {j['our_wall']:.2f}, ov {j['ov_wall']:.2f};"
          f" ov layers' sum / wall {sum(r['ms'] for r in j['ov']) / j['ov_wall']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
