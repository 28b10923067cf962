"""Read a torch CUDA allocator snapshot and say which pygraphx code holds the memory.

The snapshot is what `torch.cuda.memory._dump_snapshot` writes (`gpu_memory_probe.py
--snapshot DIR` makes one per row); it is a pickle of plain dicts, readable without a GPU.
Two views, each grouped by the innermost pygraphx (or benchmark) frame of the allocating call
and the executable / target frame above it:

* `live`: the blocks still allocated when the snapshot was taken, per memory pool
  (pool (0, 0) is the ordinary caching allocator; any other pool is a CUDA graph's private pool);
* `peak`: the blocks live at the moment the allocated total was highest, rebuilt from the
  allocation history (`device_traces`: alloc / free_completed events).

    python benchmarks/gpu_memory_snapshot.py /work/gpudata/snapshot_resnet50_b1.pickle
"""

from __future__ import annotations

import argparse
import pickle
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MB = 2**20
#: frames of these files name the caller (the outermost pygraphx step worth showing)
OUTER = ("targets/gpu/executable.py", "targets/gpu/target.py", "torch_lowering/lower.py")


@dataclass
class Block:
    """One allocation: its size, its memory pool and the Python frames that made it."""

    size: int
    pool: tuple[int, int]
    frames: list[dict[str, Any]]


def load(path: Path) -> dict[str, Any]:
    """The snapshot dict (`segments`, `device_traces`, ...)."""
    with path.open("rb") as f:
        return pickle.load(f)  # noqa: S301 - a file the probe wrote


def _ours(frame: dict[str, Any]) -> bool:
    name = frame.get("filename", "")
    return "pygraphx/" in name or "benchmarks/" in name


def where(frames: Iterable[dict[str, Any]]) -> str:
    """'innermost pygraphx frame < outer executable/target frame' for an allocation."""
    ours = [f for f in frames if _ours(f)]
    if not ours:
        return "(no pygraphx frame: torch / library internal)"

    def label(f: dict[str, Any]) -> str:
        short = f["filename"].split("pygraphx/")[-1].split("benchmarks/")[-1]
        return f"{short}:{f['line']} {f['name']}"

    inner = label(ours[0])
    outer = next((f for f in ours[1:] if any(o in f["filename"] for o in OUTER)), None)
    return inner if outer is None or outer is ours[0] else f"{inner} < {label(outer)}"


def live_blocks(snapshot: dict[str, Any]) -> list[Block]:
    """The allocated blocks at the time of the snapshot."""
    out = []
    for seg in snapshot["segments"]:
        pool = tuple(seg.get("segment_pool_id", (0, 0)))
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                out.append(Block(b["size"], pool, b.get("frames", [])))
    return out


def peak_blocks(snapshot: dict[str, Any], device: int = 0) -> tuple[int, list[Block]]:
    """The highest allocated total in the history, and the blocks live at that moment (blocks
    allocated before the history started are not seen)."""
    live: dict[int, Block] = {}
    total = peak = 0
    at_peak: list[Block] = []
    traces = snapshot.get("device_traces", [])
    for ev in traces[device] if device < len(traces) else []:
        action = ev["action"]
        if action == "alloc":
            live[ev["addr"]] = Block(ev["size"], (0, 0), ev.get("frames", []))
            total += ev["size"]
            if total > peak:
                peak, at_peak = total, list(live.values())
        elif action == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"]).size
    return peak, at_peak


def grouped(blocks: Iterable[Block], by_pool: bool = True) -> list[tuple[str, int, int]]:
    """(group, bytes, count) sorted by bytes, largest first."""
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for b in blocks:
        key = where(b.frames)
        if by_pool:
            key = f"pool{b.pool} {key}"
        sums[key][0] += b.size
        sums[key][1] += 1
    return sorted(((k, v[0], v[1]) for k, v in sums.items()), key=lambda r: -r[1])


def report(path: Path, top: int = 25) -> list[str]:
    """The two views of one snapshot as text lines."""
    snap = load(path)
    lines = [f"== {path.name}"]
    live = live_blocks(snap)
    lines.append(f"live at snapshot: {sum(b.size for b in live) / MB:.1f} MB in {len(live)} blocks")
    lines += [f"  {n / MB:8.2f} MB {c:5d}x  {k}" for k, n, c in grouped(live)[:top]]
    peak, blocks = peak_blocks(snap)
    lines.append(f"peak in history: {peak / MB:.1f} MB in {len(blocks)} blocks")
    lines += [f"  {n / MB:8.2f} MB {c:5d}x  {k}" for k, n, c in grouped(blocks, False)[:top]]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshots", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=25, help="groups shown per view")
    opts = ap.parse_args()
    for path in opts.snapshots:
        print("\n".join(report(path, opts.top)))


if __name__ == "__main__":
    main()
