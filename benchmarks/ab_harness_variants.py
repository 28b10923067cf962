"""The A/B harness's variants and models (`benchmarks/ab_harness.py` has the whole story): what
is compared, and how each variant is built.

- `Case`: one model (its ONNX bytes and seeded feeds), `load` makes one from `name[:batch]`
  (`pygraphx.models`), a zoo name (`benchmarks/zoo.py`) or an `.onnx` path;
- `Variant`: settings in force only while it compiles (`settings`: environment variables,
  `@module.NAME` module attributes, `target.NAME` options of `CpuTarget`) or a builder of its
  own; `parse_env` / `parse_variant` read them from the command line; `check_settings`,
  `check_names`, `check_bf16` refuse what a variant cannot carry;
- `compile_variant` builds one for the cpu target; `OpenVino` and `ort_outputs` are the peers
  (one more variant, and the oracle).
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scratch import scratch_dir  # noqa: E402

import pygraphx  # noqa: E402  (before torch: it sets OpenMP's spin count and the allocator)

TARGET = "target."  # a setting `target.NAME=value`: the option NAME of CpuTarget


@dataclass
class Case:
    """One model to A/B: its label, its ONNX bytes, the feeds."""

    spec: str
    data: bytes
    feeds: dict[str, np.ndarray]


@dataclass
class Variant:
    """A way to build the program: settings in force while it compiles, or a builder of its
    own (`build(case, threads)` -> anything with `run(feeds)`)."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    bf16: bool = False
    build: Callable[[Case, int], Any] | None = None
    label: str = ""

    def describe(self) -> str:
        if self.label:
            return self.label
        return ",".join(f"{k}={v}" for k, v in self.env.items()) or "(defaults)"


def parse_env(items: str | list[str] | None) -> dict[str, str]:
    """`K=V,K=V` (or a list of such) as a dict."""
    if items is None:
        return {}
    if isinstance(items, str):
        items = [items]
    env = {}
    for text in items:
        for kv in text.split(","):
            if kv:
                key, sep, value = kv.partition("=")
                if not sep:
                    raise SystemExit(f"not K=V: {kv!r}")
                env[key] = value
    return env


def parse_variant(text: str, bf16: bool = False) -> Variant:
    """`NAME:K=V,K=V` as a Variant."""
    name, _, rest = text.partition(":")
    return Variant(name, parse_env(rest), bf16)


#: settings a variant cannot carry ("in force only while it compiles" does not reach them):
#: read once a process (the native kernels' compiler and cache, the oneDNN library, the
#: allocator, OpenMP and the math libraries' own variables) or at run time (the thread
#: controls, evaluation tracing, plans made at the first run, the load check's interval)
PROCESS_KEYS = ("PGX_NATIVE", "PGX_CC", "PGX_NATIVE_CACHE", "PGX_NATIVE_BUILD_TIMEOUT",
                "PGX_ONEDNN_LIB", "PGX_CPU_KEEP_FREED", "PGX_CPU_HUGE_PAGES",
                "THP_MEM_ALLOC_ENABLE", "PGX_TRACE_EVAL", "PGX_CPU_LOAD_ADAPT",
                "PGX_CPU_STALL_ADAPT")  # fmt: skip
PROCESS_PREFIXES = ("GOMP_", "OMP_", "KMP_", "ONEDNN_", "DNNL_", "MKL_")
PROCESS_ATTRS = ("pygraphx.targets.torch_lowering.native_attention.CAUSAL_ROWS",
                 "pygraphx.targets.torch_lowering.lower_gemm.WIDEN_BLOCK",
                 "pygraphx.targets.cpu.scheduling.LOAD_CHECK_S")  # fmt: skip


def attribute_path(key: str) -> str:
    """`@module.NAME` as `pygraphx.<package>.<module>.NAME` (see `settings`)."""
    module_name, _, name = key[1:].rpartition(".")
    if not module_name.startswith("pygraphx."):
        package = "cpu" if module_name.startswith("cpu.") else "torch_lowering"
        module_name = f"pygraphx.targets.{package}.{module_name.removeprefix('cpu.')}"
    return f"{module_name}.{name}"


@functools.cache
def _pygraphx_text() -> str:
    root = Path(__file__).resolve().parents[1] / "pygraphx"
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*"))
                     if p.suffix in (".py", ".c", ".h") and p.is_file())  # fmt: skip


def check_settings(variants: list[Variant], out=None, warn: bool = True) -> None:
    """Refuse a variant setting that needs separate processes (`PROCESS_KEYS`,
    `PROCESS_PREFIXES`, `PROCESS_ATTRS`: SystemExit); warn on a `PGX_*` key that no file
    under pygraphx/ mentions (a typo would make the A/B an A/A)."""
    out = out or sys.stdout
    for v in variants:
        for key in v.env:
            if key.startswith(TARGET):
                continue
            if key.startswith("@"):
                if attribute_path(key) in PROCESS_ATTRS:
                    raise SystemExit(f"variant {v.name}: {key} is read at run time, not while "
                                     "the variant compiles: it needs separate processes")
                continue
            if key in PROCESS_KEYS or key.startswith(PROCESS_PREFIXES):
                raise SystemExit(f"variant {v.name}: {key} is read once a process or at run "
                                 "time, not while the variant compiles: it needs separate "
                                 "processes (run the harness once per value)")  # fmt: skip
            if warn and key.startswith("PGX_") and key not in _pygraphx_text():
                print(f"# WARNING variant {v.name}: {key} is mentioned by no file under "
                      "pygraphx/ (a typo? the variants may be the same program)", file=out)


def check_names(variants: list[Variant], openvino: bool) -> None:
    """Variant names must differ (the figures are kept by name), and not be `OV` with
    `--openvino`: SystemExit."""
    names = [v.name for v in variants] + (["OV"] if openvino else [])
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SystemExit(f"variant names given twice: {', '.join(twice)}"
                         + (" (`OV` is --openvino's)" if "OV" in twice and openvino else ""))


def check_bf16(variants: list[Variant], bf16: bool) -> None:
    """`--bf16` with a variant that builds its own program and does not say it is bf16
    (`Variant.bf16`): refused (it would be timed as float32 under a bf16 heading)."""
    if not bf16:
        return
    for v in variants:
        if v.build is not None and not v.bf16:
            raise SystemExit(f"--bf16: variant {v.name} builds its own program and does not "
                             "apply quantize_bf16; this script does not take --bf16")


@contextmanager
def settings(env: dict[str, str]) -> Iterator[None]:
    """`env` in force inside: environment variables, and `@module.NAME` module attributes."""
    with ExitStack() as stack:
        for key, value in env.items():
            if key.startswith("@"):
                module_name, _, name = attribute_path(key).rpartition(".")
                module = importlib.import_module(module_name)
                stack.enter_context(mock.patch.object(module, name, ast.literal_eval(value)))
            else:
                stack.enter_context(mock.patch.dict(os.environ, {key: value}))
        yield


def load(spec: str, seed: int = 0) -> Case:
    """`name[:batch]` (pygraphx.models), a zoo name (benchmarks/zoo.py; `name:test` its test
    size, else full) or an .onnx path."""
    if spec.endswith(".onnx"):
        import onnx

        data = Path(spec).read_bytes()
        model = onnx.load_from_string(data)
        init = {i.name for i in model.graph.initializer}
        rng = np.random.default_rng(seed)
        feeds = {}
        for inp in model.graph.input:
            if inp.name in init:
                continue
            t = inp.type.tensor_type
            shape = [d.dim_value or 1 for d in t.shape.dim]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
            if np.issubdtype(dtype, np.integer):
                feeds[inp.name] = rng.integers(0, 2, shape).astype(dtype)
            else:
                feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        return Case(spec, data, feeds)
    name, _, batch = spec.partition(":")
    from benchmarks.zoo import ZOO_NAMES, zoo_model

    if name in ZOO_NAMES:
        if batch.isdigit():
            raise SystemExit(f"{spec}: a zoo model takes `{name}` (full size) or `{name}:test`, "
                             "not a batch")  # fmt: skip
        path, feeds = zoo_model(name, batch if batch and not batch.isdigit() else "full")
        return Case(spec, Path(path).read_bytes(), feeds)
    from pygraphx.models import get_model, model_inputs

    model = get_model(name, batch=int(batch or 1))
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs(name, model).items()}
    return Case(spec, model.SerializeToString(), feeds)


def compile_variant(case: Case, threads: int, variant: Variant) -> Any:
    if variant.build is not None:
        return variant.build(case, threads)
    from pygraphx.targets.cpu.target import CpuTarget

    env = {k: v for k, v in variant.env.items() if not k.startswith(TARGET)}
    options = {k[len(TARGET):]: _literal(v) for k, v in variant.env.items() if k.startswith(TARGET)}
    with settings(env):
        prog = pygraphx.parse_onnx_buffer(case.data)
        if variant.bf16:
            pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=threads, **options))
    return prog


def _literal(text: str) -> Any:
    """A Python literal's value, else the text itself (`conv_output=torch`)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


class OpenVino:
    """OpenVINO's compiled model with a `run(feeds)` like a program's."""

    def __init__(self, data: bytes, threads: int, bf16: bool) -> None:
        import openvino as ov

        path = Path(scratch_dir()) / "model.onnx"
        path.write_bytes(data)
        config = {"INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32",
                  "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1}  # fmt: skip
        core = ov.Core()
        self.request = core.compile_model(core.read_model(str(path)), "CPU", config)
        self.request = self.request.create_infer_request()

    def run(self, feeds: dict) -> list:
        result = self.request.infer(feeds)
        return [np.asarray(v) for v in result.values()]


def ort_outputs(case: Case, threads: int) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(case.data, opts, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, case.feeds)]
