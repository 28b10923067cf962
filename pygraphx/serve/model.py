"""A served model: compiled programs for each batch size, their disk cache, and its signature.

With `max_batch > 0` the model's first input axis is its batch axis: one static program is
compiled per bucket (powers of two up to `max_batch`, and `max_batch`) from the ONNX file with
`map_input_dims`, and a batch of n rows runs on the smallest bucket that holds it, padded with
copies of its last row; the padding rows are dropped from the outputs. Each compiled program is
saved next to the model file (`<stem>.b<bucket>.<target>.<precision>[.O].<key>.cache.pgx`,
key: a hash of the model bytes, the settings and the pygraphx version), so a restart loads
instead of compiling. `max_batch = 0` runs the model at the shapes it declares; a `.pgx` file is
served as saved (compiled there if it was saved uncompiled).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from pygraphx.ir.program import Program
from pygraphx.ir.serialize import load, save
from pygraphx.onnx import parse_onnx
from pygraphx.passes.pipeline import optimize
from pygraphx.quantize import quantize_bf16, quantize_fp16
from pygraphx.serve.config import ConfigError, ModelSource
from pygraphx.serve.protocol import datatype_of
from pygraphx.targets import get_target
from pygraphx.version import __version__

log = logging.getLogger("pygraphx.serve")


class RequestError(ValueError):
    """One request's inputs do not fit the model (its own error; other requests go on)."""


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as the protocol shows it (-1: the batch axis)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    dtype: np.dtype


def buckets(max_batch: int) -> list[int]:
    """The batch sizes compiled for: powers of two below `max_batch`, and `max_batch`."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


class ServedModel:
    """One model's compiled programs (`instances` copies of each) and its signature."""

    def __init__(self, source: ModelSource) -> None:
        self.name = source.name
        self.config = source.config
        self.path = source.path
        self.max_batch = source.config.max_batch
        first = self._load_programs()
        self.target = first.target.name  # a saved program runs where it was compiled for
        self.inputs = self._specs(first.get_parameter_shapes().items(), batched=self.max_batch)
        outs = first.get_outputs().items()
        self.outputs = self._specs(outs, batched=self.max_batch)
        # one lock per instance: a program runs one call at a time
        self.locks = [threading.Lock() for _ in range(self.config.instances)]

    # --- loading ----------------------------------------------------------------------------
    def _load_programs(self) -> Program:
        """Fill `self.programs[instance][bucket]`; returns one program (for the signature)."""
        if self.path.suffix == ".pgx":
            self.max_batch = 0
            progs = [self._load_saved() for _ in range(self.config.instances)]
            self.programs = [{0: p} for p in progs]
            return progs[0]
        sizes = buckets(self.max_batch) if self.max_batch else [0]
        self.programs = [{} for _ in range(self.config.instances)]
        for size in sizes:
            cache = self._cache_path(size)
            for k in range(self.config.instances):
                if k == 0 and not cache.exists():
                    self.programs[0][size] = self._compile(size, cache)
                else:
                    self.programs[k][size] = load(cache)
        return self.programs[0][sizes[-1]]

    def _load_saved(self) -> Program:
        program = load(self.path)
        if not program.is_compiled():
            program.compile(get_target(self.config.target))
        return program

    def _cache_path(self, size: int) -> Path:
        cfg = self.config
        digest = hashlib.sha256(self.path.read_bytes())
        digest.update(f"{size}:{cfg.target}:{cfg.precision}:{cfg.optimize}:{__version__}".encode())
        opt = ".O" if cfg.optimize else ""
        stem = f"{self.path.stem}.b{size}.{cfg.target}.{cfg.precision}{opt}"
        return self.path.with_name(f"{stem}.{digest.hexdigest()[:12]}.cache.pgx")

    def _compile(self, size: int, cache: Path) -> Program:
        """Parse at batch `size` (0: the declared shapes), transform, compile, save to `cache`."""
        options = {"map_input_dims": self._batch_dims(size)} if size else {}
        program = parse_onnx(self.path, **options)
        if self.config.precision == "fp16":
            quantize_fp16(program)
        elif self.config.precision == "bf16":
            quantize_bf16(program)
        if self.config.optimize:
            optimize(program)
        program.compile(get_target(self.config.target))
        log.info("compiled %s batch %s for %s: %s", self.name, size, program.target.name, cache)
        # written aside and renamed: replicas loading the same model never read half a file
        partial = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        save(program, partial)
        os.replace(partial, cache)
        return program

    def _batch_dims(self, size: int) -> dict[str, list[int]]:
        """map_input_dims: every graph input at batch `size`, its other axes as declared."""
        model = onnx.load(str(self.path), load_external_data=False)
        initializers = {i.name for i in model.graph.initializer}
        dims = {}
        for vi in model.graph.input:
            if vi.name in initializers:
                continue
            rest = [d.dim_value for d in vi.type.tensor_type.shape.dim[1:]]
            if not vi.type.tensor_type.shape.dim or 0 in rest:
                raise ConfigError(
                    f"{self.path}: input {vi.name!r} needs a batch axis and fixed other axes to "
                    "be batched (max_batch > 0); set max_batch to 0 to serve it as declared"
                )
            dims[vi.name] = [size, *rest]
        return dims

    def _specs(self, items, batched: int) -> list[TensorSpec]:
        specs = []
        for name, shape in items:
            lens = list(shape.max_lens() if shape.dynamic() else shape.lens())
            if batched:
                lens[0] = -1
            dtype = shape.dtype()
            specs.append(TensorSpec(name, datatype_of(dtype), tuple(lens), dtype))
        return specs

    # --- running ----------------------------------------------------------------------------
    def check(self, inputs: dict[str, np.ndarray]) -> int:
        """The batch size of one request's inputs (1 for unbatched models); `RequestError`
        names what does not fit."""
        expected = {s.name: s for s in self.inputs}
        if set(inputs) != set(expected):
            raise RequestError(
                f"model {self.name!r} takes inputs {sorted(expected)}, got {sorted(inputs)}"
            )
        rows = set()
        for name, arr in inputs.items():
            spec = expected[name]
            if arr.dtype != spec.dtype:
                got = datatype_of(arr.dtype)
                raise RequestError(f"input {name!r}: expects {spec.datatype}, got {got}")
            fixed = spec.shape[1:] if self.max_batch else spec.shape
            given = arr.shape[1:] if self.max_batch else arr.shape
            if tuple(given) != tuple(fixed) or (self.max_batch and arr.ndim == 0):
                raise RequestError(
                    f"input {name!r}: expects shape {list(spec.shape)}, got {list(arr.shape)}"
                )
            rows.add(arr.shape[0] if self.max_batch else 1)
        if len(rows) != 1:
            raise RequestError(f"inputs disagree on the batch size: {sorted(rows)}")
        n = rows.pop()
        if self.max_batch and not 1 <= n <= self.max_batch:
            raise RequestError(f"batch size {n} is outside 1..{self.max_batch} (max_batch)")
        return n

    def run(self, inputs: dict[str, np.ndarray], instance: int = 0) -> dict[str, np.ndarray]:
        """Run checked inputs of n rows on `instance`; outputs by name, n rows each."""
        programs = self.programs[instance]
        if not self.max_batch:
            with self.locks[instance]:
                results = programs[0].run(inputs)
            return self._named(results, None)
        n = next(iter(inputs.values())).shape[0]
        size = min(b for b in programs if b >= n)
        if size > n:  # pad with copies of the last row; they are dropped below
            inputs = {
                k: np.concatenate([v, np.repeat(v[-1:], size - n, axis=0)])
                for k, v in inputs.items()
            }
        with self.locks[instance]:
            results = programs[size].run(inputs)
        return self._named(results, n)

    def _named(self, results: list, rows: int | None) -> dict[str, np.ndarray]:
        """Outputs by name, copied out of the program's buffers (the next run reuses them)."""
        out = {}
        for spec, r in zip(self.outputs, results, strict=True):
            arr = np.array(r, copy=True)
            out[spec.name] = arr if rows is None else arr[:rows]
        return out
