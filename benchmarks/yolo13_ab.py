"""bf16's graph tail in float32 (`truncate_float.WIDE_TAIL`, `PGX_BF16_WIDE_TAIL`): A/B in one
process, the earlier rule ("old") against the tail rule ("new"), with each one's relative RMS
error against ONNX Runtime float32 (and OpenVINO bf16's, `--openvino`).

    PYTHONPATH=. python benchmarks/yolo13_ab.py --threads 2 --rounds 8 --repeat 5 --openvino
    PYTHONPATH=. python benchmarks/yolo13_ab.py --models resnet50 mobilenetv2 --rounds 0

Both programs are quantized (`quantize_bf16`, the default "products" policy) from the same
parsed model, the rule switched by the module constant between the two calls, and compiled for
`cpu` with `cpu_vs_peers.py`'s settings (arena conv outputs, step threads). Printed per model:
whether the two quantized programs differ at all (printed form; identical ones compile to the
same steps), each one's error, then (`--rounds` > 0) timing in alternating blocks - a warm-up
run and `--repeat` timed runs of one program, then of the other, the order reversed every
round - with the median wall ms over all timed runs, the best block's median, and the mean
process CPU ms per run.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from benchmarks.cpu_engines import make_openvino, make_ort  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402

#: the module (the package's `truncate_float` attribute is the function of that name)
truncate_float = importlib.import_module("pygraphx.quantize.truncate_float")
BUILTIN = ("resnet50", "mobilenetv2", "bert_base", "gpt2")


def load(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    if name in BUILTIN:
        from pygraphx.models import get_model, model_inputs

        model = get_model(name)
        return model, model_inputs(name, model)
    from benchmarks.zoo import zoo_model

    path, feeds = zoo_model(name, "full")
    return onnx.load(path), feeds


def rel_rms(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The worst output's ||got - want|| / ||want|| (as `cpu_vs_peers.relative_error`)."""
    return max(
        float(np.linalg.norm(np.asarray(g, np.float64) - w) / np.linalg.norm(w))
        for g, w in zip(got, want, strict=True)
    )


def quantized(model: onnx.ModelProto, wide_tail: bool) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    saved = truncate_float.WIDE_TAIL
    truncate_float.WIDE_TAIL = wide_tail
    try:
        pygraphx.quantize_bf16(prog)
    finally:
        truncate_float.WIDE_TAIL = saved
    return prog


def ab(name: str, args: argparse.Namespace) -> None:
    model, feeds = load(name)
    want = [np.asarray(w, np.float64) for w in make_ort(model, args.threads)[0](feeds)]
    progs = {"old": quantized(model, False), "new": quantized(model, True)}
    same = str(progs["old"]) == str(progs["new"])
    line = f"{name} t{args.threads}: quantized programs {'identical' if same else 'differ'}"
    for mode, prog in progs.items():
        prog.compile(CpuTarget(conv_output="arena", threads=args.threads, step_threads=True))
        line += f"; {mode} rel err {rel_rms([np.asarray(a) for a in prog.run(feeds)], want):.2e}"
    if args.openvino:
        run_ov = make_openvino(model, args.threads, None)[0]
        line += f"; OpenVINO default rel err {rel_rms(run_ov(feeds), want):.2e}"
    print(line, flush=True)
    if args.rounds <= 0:
        return
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in progs}
    blocks: dict[str, list[float]] = {m: [] for m in progs}
    for r in range(args.rounds):
        for mode in list(progs)[:: 1 if r % 2 == 0 else -1]:
            progs[mode].run(feeds)
            block = []
            for _ in range(args.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                progs[mode].run(feeds)
                block.append((time.perf_counter() - t0, time.process_time() - c0))
            times[mode] += block
            blocks[mode].append(statistics.median(w for w, _ in block))
    for mode in progs:
        wall = statistics.median(w for w, _ in times[mode]) * 1e3
        cpu = statistics.fmean(c for _, c in times[mode]) * 1e3
        print(f"  {name} t{args.threads} {mode}: wall {wall:7.2f} ms (best block "
              f"{min(blocks[mode]) * 1e3:7.2f}), cpu {cpu:7.2f} ms/run", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["yolov8_style"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--openvino", action="store_true")
    args = ap.parse_args(argv)
    print(f"loadavg at start: {Path('/proc/loadavg').read_text().split()[0]}", flush=True)
    for name in args.models:
        ab(name, args)
    print(f"loadavg at end: {Path('/proc/loadavg').read_text().split()[0]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
