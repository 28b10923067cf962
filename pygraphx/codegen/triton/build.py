"""`build_kernel`: a `GroupTrace` as a compiled, cached, autotuned Triton kernel.

The source (`kernels.py`) is written to `<cache>/<key>.py` and imported from there (`triton.jit`
reads a function's source from its file). The key is a hash of the source, the device's name
and the Triton version, so a second compile of the same model finds its kernels on disk; the
cache directory is `$PGX_CACHE_DIR` or `~/.cache/pygraphx/kernels`. At the first call a small
autotune times each launch configuration (`BLOCK`, `num_warps`) on the arguments themselves
(on copies where the output's bytes overlap an input's; `timing.py`: device time only, the
candidates in turns, near-ties to the default) and writes the choice to `<key>.tuned2.json`,
which later builds read back. Under the interpreter (`TRITON_INTERPRET=1`,
CPU tensors) timing means nothing: the widest block is used and nothing is written.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
import triton

from pygraphx.codegen.trace import GroupTrace, TensorDesc
from pygraphx.codegen.triton.emitter import UnsupportedGroup
from pygraphx.codegen.triton.kernels import KernelSource, QuantOutput, kernel_source
from pygraphx.codegen.triton.timing import pick, time_candidates

log = logging.getLogger(__name__)

Config = dict[str, int]
#: the tuned configuration's file beside the kernel: named after the way it was timed, so a
#: choice made by an older timing (`timing.py`'s docstring says why it was noise) is not reused
TUNED_SUFFIX = ".tuned2.json"


def cache_dir() -> Path:
    """Where kernels and their tuned configurations live."""
    env = os.environ.get("PGX_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "pygraphx" / "kernels"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def device_name(device: torch.device) -> str:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return f"{device.type}-interpreter"


def kernel_key(source: str, device: torch.device) -> str:
    text = f"{source}\0{device_name(device)}\0{triton.__version__}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def candidates(src: KernelSource) -> list[Config]:
    """Launch configurations to try, the default (used when not timing) first."""
    if src.kind == "pointwise":
        top = max(128, 1 << max(src.numel - 1, 0).bit_length())
        blocks = [b for b in (1024, 512, 256, 2048, 4096) if b <= max(top, 256)] or [256]
        return [{"BLOCK": b, "num_warps": w} for b in blocks for w in (4, 8)]
    if src.kind == "row":
        lanes = 1 << max(src.row_len - 1, 0).bit_length()
        warps = [w for w in (4, 1, 2, 8, 16) if w * 32 <= max(lanes, 32)] or [1]
        return [{"BLOCK": 1, "num_warps": w} for w in warps]
    return [{"BLOCK": b, "num_warps": w} for b in (2048, 1024, 4096) for w in (8, 4, 16)]


def _load_module(path: Path, key: str) -> Any:
    name = f"pygraphx_kernel_{key}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import the generated kernel {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # atomic: a concurrent build reads the old or the new file whole


class TritonKernel:
    """A built kernel: `kernel(inputs, out)` runs the group, writing `out` (returned); a kernel
    with a quantised output (`quant`) takes `kernel(inputs, out, (qscale, qout))`."""

    def __init__(
        self,
        group: GroupTrace,
        src: KernelSource,
        key: str,
        path: Path,
        quant: QuantOutput | None = None,
    ) -> None:
        self.group = group
        self.quant = quant
        self.kind = src.kind
        self.source = src.source
        self.key = key
        self.path = path
        self._src = src
        self._fn = _load_module(path, key).kernel
        self.config: Config | None = self._read_config()

    @property
    def _config_path(self) -> Path:
        return self.path.with_suffix(TUNED_SUFFIX)

    def _read_config(self) -> Config | None:
        try:
            return json.loads(self._config_path.read_text())
        except FileNotFoundError:
            return None

    def __call__(
        self, inputs: Sequence[torch.Tensor], out: torch.Tensor, extra: Sequence[torch.Tensor] = ()
    ) -> torch.Tensor:
        self._check(inputs, out, extra)
        if self._src.numel == 0:
            return out
        if self.config is None:
            self.config = self._autotune(inputs, out, extra)
        self._launch(inputs, out, self.config, extra)
        return out

    def compile_ahead(
        self, inputs: Sequence[torch.Tensor], out: torch.Tensor, extra: Sequence[torch.Tensor] = ()
    ) -> int:
        """Compile, without launching, the configurations the first call will run (the tuned
        one when the disk cache has it, else every autotune candidate); returns how many.
        Tensors only give dtypes and alignment here: any of the right dtype will do."""
        configs = [self.config] if self.config is not None else candidates(self._src)
        for config in configs:
            self._fn.warmup(*inputs, out, *extra, grid=self._grid(config), **config)
        return len(configs)

    def _grid(self, config: Config) -> tuple[int]:
        if self.kind == "pointwise":
            return (triton.cdiv(self._src.numel, config["BLOCK"]),)
        return (self._src.numel,)

    def _launch(
        self,
        inputs: Sequence[torch.Tensor],
        out: torch.Tensor,
        config: Config,
        extra: Sequence[torch.Tensor] = (),
    ) -> None:
        self._fn[self._grid(config)](*inputs, out, *extra, **config)

    def _check(
        self, inputs: Sequence[torch.Tensor], out: torch.Tensor, extra: Sequence[torch.Tensor]
    ) -> None:
        if len(extra) != (2 if self.quant else 0):
            raise ValueError(
                f"{self.group.name}: {len(extra)} extra arguments; the kernel takes "
                + ("(qscale, qout)" if self.quant else "none")
            )
        if self.quant is not None and not _fits(extra[1], _quant_desc(self.group.output)):
            raise ValueError(f"{self.group.name}: the quantised output is not laid out as `out`")
        descs = self.group.inputs
        if len(inputs) != len(descs):
            raise ValueError(f"{self.group.name}: {len(inputs)} inputs for {len(descs)}")
        for k, (t, d) in enumerate([*zip(inputs, descs, strict=True), (out, self.group.output)]):
            what = "output" if k == len(descs) else f"input {k}"
            if not _fits(t, d):
                raise ValueError(
                    f"{self.group.name}: {what} is {tuple(t.shape)} {t.dtype} strides "
                    f"{t.stride()}; the kernel was built for {d.lens} {d.dtype} strides {d.strides}"
                )

    def _autotune(
        self, inputs: Sequence[torch.Tensor], out: torch.Tensor, extra: Sequence[torch.Tensor]
    ) -> Config:
        options = candidates(self._src)
        if interpreting() or out.device.type != "cuda":
            # no timing without a device: the interpreter runs one program at a time in
            # Python, so the widest block is the quickest there
            choice = max(options, key=lambda c: c["BLOCK"])
            log.debug("%s: not timed (interpreter or CPU): %s", self.key, choice)
            return choice
        if len(options) == 1:
            return options[0]
        if any(_overlaps(t, out) for t in inputs):  # written in place: time on copies
            inputs, out = [t.clone() for t in inputs], out.clone()
        runs = [lambda c=c: self._launch(inputs, out, c, extra) for c in options]
        times = time_candidates(runs)
        best = pick(times, options)
        _write(self._config_path, json.dumps(best))
        log.info(
            "%s: tuned %s (%s)", self.key, best,
            ", ".join(f"{c} {t * 1e3:.1f} us" for c, t in zip(options, times, strict=True)),
        )  # fmt: skip
        return best


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    reach = [s * (n - 1) for n, s in zip(t.shape, t.stride(), strict=True)]
    size, base = t.element_size(), t.data_ptr()
    return base + size * sum(r for r in reach if r < 0), base + size * (
        1 + sum(r for r in reach if r > 0)
    )


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` may share bytes (arena slots share one storage, so compare ranges)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    name = str(dtype).removeprefix("torch.")
    names = {
        "bool": "bool",
        "float8_e4m3fn": "float8_e4m3fn",
        "float8_e5m2": "float8_e5m2",
        "float8_e4m3fnuz": "float8_e4m3fnuz",
        "float8_e5m2fnuz": "float8_e5m2fnuz",
    }
    if name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    if name in names and name.startswith("float8"):
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def _quant_desc(out: TensorDesc) -> TensorDesc:
    """The quantised output's description: the float output's lens and strides, int8 or the
    bytes (uint8) of an fp8 tensor (either is one byte)."""
    return TensorDesc(out.lens, out.strides, np.dtype(np.int8))


def _fits(t: torch.Tensor, d: TensorDesc) -> bool:
    if d.dtype == np.int8 and t.dtype == torch.uint8:  # the bytes of an fp8 tensor
        d = TensorDesc(d.lens, d.strides, np.dtype(np.uint8))
    if tuple(t.shape) != tuple(d.lens) or _numpy_dtype(t.dtype) != d.dtype:
        return False
    # strides matter only where a dimension has more than one element
    return all(n == 1 or s == ds for n, s, ds in zip(d.lens, t.stride(), d.strides, strict=True))


def build_kernel(
    group: GroupTrace,
    device: torch.device | str | None = None,
    directory: Path | None = None,
    quant: QuantOutput | None = None,
) -> TritonKernel:
    """Generate (or find in the cache) the Triton kernel of `group` for `device` (default:
    the current CUDA device, or the CPU under the interpreter), with the quantised output
    `quant` when given. Raises `UnsupportedGroup` naming what has no Triton form yet."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
    dev = torch.device(device)
    src = kernel_source(group, quant)
    key = kernel_key(src.source, dev)
    where = directory or cache_dir()
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"k{key}.py"
    if not path.exists() or path.read_text() != src.source:
        _write(path, src.source)
    return TritonKernel(group, src, key, path, quant)


__all__ = [
    "QuantOutput",
    "TritonKernel",
    "UnsupportedGroup",
    "build_kernel",
    "cache_dir",
    "kernel_key",
]
