"""Which tile the 8-bit convolution kernel (`quant_conv_kernels.conv`) runs per layer shape.

Autotuning every shape over `CONV_CONFIGS` made most of a ResNet-50 prepare: int8 80-87 s,
fp8 over 120 s (each configuration is its own compile per specialisation, then timed). So a
shape's tile comes, in this order, from

1. this process's choices (a shape tuned or looked up once keeps its tile);
2. the on-disk record (`PGX_GPU_TILE_RECORD`, default `~/.cache/pygraphx/conv_tiles.json`),
   one section per (device name, Triton version), written after each autotuned shape;
3. `TABLE` on compute capability 9.x (H100 / H200): ResNet-50's layer shapes at batch 32
   (for fp8 kernels `FP8_TABLE` first, where fp8 timed best at another tile; on an H100
   `H100_TABLE` / `H100_FP8_TABLE` before those, where the H100 timed another tile or form
   faster);

and only a shape found in none of them is autotuned (its tile then recorded). A shape is
(kind `int8` / `fp8`, input mode, M, N, K, C): the epilogue is not part of it (it changes a
tile's timing far less than the shape does). `PGX_GPU_CONV_TILES=tune` autotunes every shape
(ignoring the record and the table, still writing the record); `table`, the default, is the
order above. Autotuning says how far it is, one log line every `PROGRESS_EVERY` shapes.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

import torch
import triton

from pygraphx.targets.settings import env_choice

log = logging.getLogger(__name__)

__all__ = [
    "FP8_TABLE",
    "H100_FP8_TABLE",
    "H100_NAME",
    "H100_TABLE",
    "PRE",
    "PROGRESS_EVERY",
    "RECORD_ENV",
    "TABLE",
    "TILES_ENV",
    "TileChoice",
    "device_section",
    "table_tile",
    "tile_form",
    "tile_key",
]

TILES_ENV = "PGX_GPU_CONV_TILES"
RECORD_ENV = "PGX_GPU_TILE_RECORD"
#: a log line after this many autotuned shapes (and after the first)
PROGRESS_EVERY = 4

#: BLOCK_M, BLOCK_N, BLOCK_K, warps, stages; an `H100_TABLE` tile may add a sixth, `PRE`
#: (1: the residual's tile is loaded before the product, `quant_conv_kernels.PRE_RES`)
Tile = tuple[int, ...]
#: a `Tile`'s sixth entry: load the residual first
PRE = 1

#: (M, N, K, C) -> tile, for both int8 and fp8 (one byte an operand element: the same shared
#: memory, loads and tensor-core rate on Hopper). The int8 ResNet-50 b32 autotuning on an
#: H200 over `CONV_CONFIGS` (`benchmarks/results/h200_resgpu_conv_tiles.json`: 20 shapes; where
#: epilogues kept different tiles for one shape, the first listed).
TABLE: dict[tuple[int, int, int, int], Tile] = {
    (1568, 512, 2048, 2048): (64, 64, 64, 4, 5),
    (1568, 512, 4608, 512): (64, 64, 64, 4, 5),
    (1568, 2048, 512, 512): (128, 128, 128, 8, 3),
    (1568, 2048, 1024, 1024): (128, 128, 64, 4, 4),
    (6272, 256, 1024, 1024): (64, 128, 128, 4, 4),
    (6272, 256, 2304, 256): (64, 128, 128, 4, 4),
    (6272, 512, 1024, 1024): (128, 64, 64, 4, 4),
    (6272, 1024, 256, 256): (64, 128, 128, 4, 2),
    (6272, 1024, 512, 512): (128, 64, 64, 4, 4),
    (25088, 128, 512, 512): (128, 64, 64, 4, 4),
    (25088, 128, 1152, 128): (128, 64, 64, 4, 4),
    (25088, 256, 512, 512): (256, 64, 64, 8, 4),
    (25088, 512, 128, 128): (64, 128, 128, 4, 2),
    (25088, 512, 256, 256): (128, 64, 64, 4, 4),
    (100352, 64, 64, 64): (64, 64, 64, 4, 2),
    (100352, 64, 256, 256): (128, 64, 128, 4, 2),
    (100352, 64, 576, 64): (128, 64, 64, 4, 4),
    (100352, 128, 256, 256): (64, 128, 128, 4, 2),
    (100352, 256, 64, 64): (64, 128, 64, 4, 2),
    (401408, 64, 224, 32): (128, 64, 32, 4, 4),
}  # fmt: skip
#: fp8 tiles where another beat `TABLE`'s for the fp8 kernel: ResNet-50 b32 layers on an H100,
#: the kernel with the program's epilogue, CUDA-graph replays (`benchmarks/fp8conv_probe.py`,
#: `benchmarks/results/h100_fp8conv_probe.json`; us, fp8 at this tile against `TABLE`'s):
#: 1x1 256 -> 64 at 56x56 20.65 / 22.06, 1x1 64 -> 256 + residual 58.09 / 63.19, 1x1 256 -> 128
#: 33.84 / 35.83, 3x3 128 at 28x28 17.52 / 18.56, 1x1 512 -> 128 11.05 / 11.72
FP8_TABLE: dict[tuple[int, int, int, int], Tile] = {
    (100352, 64, 256, 256): (64, 64, 128, 4, 2),
    (100352, 256, 64, 64): (64, 64, 64, 4, 2),
    (100352, 128, 256, 256): (64, 64, 128, 4, 2),
    (25088, 128, 1152, 128): (128, 64, 128, 4, 3),
    (25088, 128, 512, 512): (128, 64, 128, 4, 3),
}  # fmt: skip

#: int8 tiles where another tile or form beat `TABLE`'s on an H100 (ResNet-50 b32 layers with
#: the program's epilogue, CUDA-graph replays, `benchmarks/int8res_probe.py`,
#: `benchmarks/results/h100_int8res_probe{,2}.json`, two calls; us at this tile against
#: `TABLE`'s, fused cuDNN fp16 in the same call): 1x1 64 -> 256 at 56x56 + residual 56.06 /
#: 59.38 (fp16 49.18; the second call 56.11 / 59.67), 1x1 128 -> 512 at 28x28 + residual
#: 31.38 / 33.86 (26.82), 1x1 512 -> 2048 at 7x7 + residual 12.27 / 15.44 (11.89), 3x3 512
#: at 7x7 23.37 / 25.46 (16.46), 3x3 256 at 14x14 16.98 / 17.82 (16.54), 1x1 64 -> 64 at
#: 56x56 11.56 / 12.35 (8.28), 1x1 512 -> 256 at 28x28 19.24 / 20.21 (14.97), 1x1 1024 -> 512
#: at 14x14 13.19 / 14.80 (12.52). Not timed on an H200: `TABLE` there.
H100_TABLE: dict[tuple[int, int, int, int], Tile] = {
    (100352, 256, 64, 64): (64, 128, 64, 4, 2, PRE),
    (25088, 512, 128, 128): (64, 64, 128, 4, 2, PRE),
    (1568, 2048, 512, 512): (64, 64, 128, 4, 3),
    (1568, 512, 4608, 512): (64, 64, 128, 4, 3),
    (6272, 256, 2304, 256): (64, 64, 128, 4, 3),
    (100352, 64, 64, 64): (128, 64, 64, 4, 2),
    (25088, 256, 512, 512): (128, 64, 128, 4, 3),
    (6272, 512, 1024, 1024): (128, 64, 128, 4, 3),
}  # fmt: skip
#: fp8 tiles where another tile or form beat `FP8_TABLE`'s / `TABLE`'s on an H100 (the second
#: call above, `h100_int8res_probe2.json`; us): 3x3 512 at 7x7 21.15 / 26.63 (fp16 16.44),
#: 3x3 256 at 14x14 16.49 / 17.03 (16.74), 1x1 512 -> 2048 at 7x7 + residual 12.78 / 15.04
#: (11.69), 1x1 128 -> 512 at 28x28 + residual 32.94 / 36.06 (26.82), 1x1 64 -> 256 at 56x56
#: + residual 56.41 / 57.66 (49.10; the first call 56.40 / 58.45), 1x1 512 -> 256 at 28x28
#: 20.51 / 23.98 (14.97), 1x1 1024 -> 512 at 14x14 13.82 / 15.85 (12.52). H100 only.
H100_FP8_TABLE: dict[tuple[int, int, int, int], Tile] = {
    (100352, 256, 64, 64): (64, 64, 64, 4, 2, PRE),
    (25088, 512, 128, 128): (64, 64, 128, 4, 2, PRE),
    (1568, 2048, 512, 512): (64, 64, 128, 4, 3),
    (1568, 512, 4608, 512): (64, 64, 128, 4, 3),
    (6272, 256, 2304, 256): (64, 64, 128, 4, 3),
    (25088, 256, 512, 512): (128, 64, 128, 4, 3),
    (6272, 512, 1024, 1024): (128, 64, 128, 4, 3),
}  # fmt: skip
#: tiles of the expansions that read an 8-bit residual and write only the 8-bit result
#: (`quantize_int8(..., residuals=True)`; key form `R8`), int8 and fp8 (one byte an element
#: either way): on an H100 (`benchmarks/int8r_probe.py`, `benchmarks/results/
#: h100_int8r_probe.json`; us at this tile, the int8 form at `H100_TABLE`'s tile, cuDNN's fused
#: half): 1x1 64 -> 256 at 56x56 48.4 / 58.2 (48.9), 128 -> 512 at 28x28 25.9 / 33.6 (24.6),
#: 256 -> 1024 at 14x14 15.5 / 17.3 (13.1), 512 -> 2048 at 7x7 13.1 / 13.6 (11.6). H100 only.
H100_R8_TABLE: dict[tuple[int, int, int, int], Tile] = {
    (100352, 256, 64, 64): (128, 64, 64, 4, 2, PRE),
    (25088, 512, 128, 128): (64, 128, 64, 4, 2, PRE),
    (6272, 1024, 256, 256): (128, 64, 64, 4, 2, PRE),
    (1568, 2048, 512, 512): (128, 128, 64, 4, 2, PRE),
}  # fmt: skip
#: the key form of a convolution whose epilogue reads an 8-bit residual
R8 = "r8"
#: the device name `H100_TABLE` applies to (`device_section`'s name holds it)
H100_NAME = "H100"


def table_tile(
    shape: tuple[int, int, int, int], section: str, fp8: bool, form: str = ""
) -> Tile | None:
    """The tables' tile of `shape` on a Hopper device of record section `section` (its name):
    on an H100 `H100_R8_TABLE` for the `R8` form, then `H100_FP8_TABLE` / `H100_TABLE`, then for
    fp8 kernels `FP8_TABLE`, then `TABLE`; None where no table has it."""
    h100 = H100_NAME in section.split(" | ")[0]
    tables = [H100_R8_TABLE] if h100 and form == R8 else []
    tables += [H100_FP8_TABLE if fp8 else H100_TABLE] if h100 else []
    tables += [FP8_TABLE, TABLE] if fp8 else [TABLE]
    return next((t[shape] for t in tables if shape in t), None)


def tile_form(tile: Tile) -> tuple[tuple[int, int, int, int, int], bool]:
    """(the five tile entries, whether the residual is loaded before the product)."""
    return tuple(tile[:5]), len(tile) > 5 and tile[5] == PRE


def tile_key(fp8: bool, mode: int, m: int, n: int, k: int, c: int, form: str = "") -> str:
    """The record's name of a convolution shape (and epilogue `form`: `R8` or none)."""
    return f"{'fp8' if fp8 else 'int8'}:{mode}:{m}x{n}x{k}x{c}" + (f":{form}" if form else "")


def _record_path() -> Path | None:
    raw = os.environ.get(RECORD_ENV, "").strip()
    if raw.lower() in ("0", "off", "none"):
        return None
    return Path(raw) if raw else Path.home() / ".cache" / "pygraphx" / "conv_tiles.json"


@functools.cache
def device_section(index: int) -> tuple[str, bool]:
    """(the record's section of CUDA device `index`: its name and the Triton version, whether
    `TABLE` applies there: compute capability 9.x)."""
    name = f"{torch.cuda.get_device_name(index)} | triton {triton.__version__}"
    return name, torch.cuda.get_device_capability(index)[0] == 9


def _well_formed(tile: object) -> bool:
    """A record's tile as `Tile` wants it: 5 positive integers, and optionally a sixth that is
    0 or `PRE` (a hand-edited or foreign file may hold anything)."""
    if not isinstance(tile, list | tuple) or len(tile) not in (5, 6):
        return False
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in tile):
        return False
    return all(v > 0 for v in tile[:5]) and tile[5:] in ((), (0,), (PRE,), [], [0], [PRE])


def _mode() -> str:
    return env_choice(TILES_ENV, ("table", "tune"), "table")


class TileChoice:
    """The tiles of one process (module docstring): `find` a shape's tile, `keep` an
    autotuned one."""

    def __init__(self) -> None:
        self.chosen: dict[str, Tile] = {}
        self.record: dict[str, dict[str, list[int]]] | None = None
        self.tuned, self.looked_up, self.tuning_s = 0, 0, 0.0

    def _read(self) -> dict[str, dict[str, list[int]]]:
        if self.record is None:
            self.record = {}
            path = _record_path()
            if path is not None and path.is_file():
                try:
                    record = json.loads(path.read_text())
                except (OSError, ValueError) as exc:
                    log.warning("gpu conv tiles: record %s not read (%s); autotuning", path, exc)
                else:
                    sections = record.items() if isinstance(record, dict) else ()
                    self.record = {k: v for k, v in sections if isinstance(v, dict)}
                    if len(self.record) != (len(record) if isinstance(record, dict) else -1):
                        log.warning("gpu conv tiles: record %s holds entries that are not "
                                    "sections of tiles; those ignored", path)  # fmt: skip
        return self.record

    def find(
        self, key: str, shape: tuple[int, int, int, int], section: str, hopper: bool,
        fp8: bool = False, form: str = "",
    ) -> Tile | None:  # fmt: skip
        """`key`'s tile from this process, the record's `section` or (`hopper`) the tables
        (`table_tile`); None: autotune it."""
        if key in self.chosen:
            return self.chosen[key]
        if _mode() == "tune":
            return None
        tile = self._read().get(section, {}).get(key)
        if tile is not None and not _well_formed(tile):
            log.warning("gpu conv tiles: record entry %s = %r is not a tile; "
                        "ignored", key, tile)  # fmt: skip
            tile = None
        if tile is None and hopper:
            tile = table_tile(shape, section, fp8, form)
        if tile is not None:
            self.looked_up += 1
            if self.looked_up == 1:
                log.info("gpu conv tiles: %s's record and table (%s)", section, TILES_ENV)
            self.chosen[key] = tuple(tile)
        return self.chosen.get(key)

    def keep(self, key: str, tile: Tile, section: str, seconds: float) -> None:
        """`tile`, autotuned for `key` in `seconds`: chosen from now on, and recorded."""
        self.chosen[key] = tile
        self.tuned += 1
        self.tuning_s += seconds
        if self.tuned == 1 or self.tuned % PROGRESS_EVERY == 0:
            log.info(
                "gpu conv tiles: %d shapes autotuned (%.1f s; %d from the record or table), "
                "last %s -> %s", self.tuned, self.tuning_s, self.looked_up, key, tile,
            )  # fmt: skip
        path = _record_path()
        if path is None:
            return
        record = self._read()
        record.setdefault(section, {})[key] = list(tile)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.with_suffix(f".{os.getpid()}.tmp")
            temp.write_text(json.dumps(record, indent=0, sort_keys=True))
            temp.replace(path)
        except OSError as exc:
            log.warning("gpu conv tiles: record %s not written (%s)", path, exc)
