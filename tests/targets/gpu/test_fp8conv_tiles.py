"""The convolution kernel's tile choice (`conv_tiles`): the table's tiles are ones autotuning
would time, the on-disk record round-trips, and a launch at a found tile runs no autotuning and
computes torch's convolution of the same 8-bit values (under the interpreter on CPU, or the
GPU)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from pygraphx.targets.gpu import conv_tiles  # noqa: E402
from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F8 = torch.float8_e4m3fn


def _configs() -> list:
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                      num_warps=warps, num_stages=stages)
        for bm, bn, bk, warps, stages in qck.CONV_CONFIGS
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("table", "shape"),
    [("int8", s) for s in sorted(conv_tiles.TABLE)]
    + [("fp8", s) for s in sorted(conv_tiles.FP8_TABLE)],
)
def test_table_tiles_are_ones_autotuning_times(table, shape) -> None:
    """Each table tile is among the configurations `_prune` keeps for its shape (K block
    dividing C, `ROWS` K blocks for the stem, two stages for one or two K blocks): the table
    picks within the autotuning's candidates, it adds none."""
    m, n, k, c = shape
    mode = qck.ROWS if c < qck.CONV_BLOCK_K else qck.IMPLICIT
    kept = {
        (cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"], cfg.num_warps,
         cfg.num_stages)
        for cfg in qck._prune(_configs(), {"C": c, "N": n, "K": k}, MODE=mode)
    }  # fmt: skip
    tiles = conv_tiles.TABLE if table == "int8" else conv_tiles.FP8_TABLE
    assert tiles[shape] in kept, (shape, sorted(kept))


def test_record_round_trip(tmp_path, monkeypatch, caplog) -> None:
    """A kept tile is written to the record under its section and found by a new process's
    choice there (not in another section); `tune` ignores record and table; the table answers
    on Hopper only; an unreadable record is announced and ignored."""
    path = tmp_path / "tiles.json"
    monkeypatch.setenv(conv_tiles.RECORD_ENV, str(path))
    monkeypatch.delenv(conv_tiles.TILES_ENV, raising=False)
    key = conv_tiles.tile_key(True, qck.IMPLICIT, 100, 64, 576, 64)
    first = conv_tiles.TileChoice()
    assert first.find(key, (100, 64, 576, 64), "dev A", False) is None
    first.keep(key, (64, 64, 64, 4, 5), "dev A", 0.5)
    assert json.loads(path.read_text()) == {"dev A": {key: [64, 64, 64, 4, 5]}}
    assert first.find(key, (100, 64, 576, 64), "dev A", False) == (64, 64, 64, 4, 5)
    again = conv_tiles.TileChoice()
    assert again.find(key, (100, 64, 576, 64), "dev A", False) == (64, 64, 64, 4, 5)
    assert conv_tiles.TileChoice().find(key, (100, 64, 576, 64), "dev B", False) is None
    shape = (100352, 64, 576, 64)
    hop = conv_tiles.tile_key(False, qck.IMPLICIT, *shape)
    assert conv_tiles.TileChoice().find(hop, shape, "dev B", True) == conv_tiles.TABLE[shape]
    fp8_shape = next(iter(conv_tiles.FP8_TABLE))
    assert conv_tiles.FP8_TABLE[fp8_shape] != conv_tiles.TABLE[fp8_shape]
    fp8_key = conv_tiles.tile_key(True, qck.POINTWISE, *fp8_shape)
    int8_key = conv_tiles.tile_key(False, qck.POINTWISE, *fp8_shape)
    fresh = conv_tiles.TileChoice()
    assert fresh.find(fp8_key, fp8_shape, "dev B", True, True) == conv_tiles.FP8_TABLE[fp8_shape]
    assert fresh.find(int8_key, fp8_shape, "dev B", True, False) == conv_tiles.TABLE[fp8_shape]
    monkeypatch.setenv(conv_tiles.TILES_ENV, "tune")
    assert conv_tiles.TileChoice().find(key, (100, 64, 576, 64), "dev A", True) is None
    assert conv_tiles.TileChoice().find(hop, shape, "dev B", True) is None
    monkeypatch.setenv(conv_tiles.TILES_ENV, "fast")
    with pytest.raises(ValueError, match=conv_tiles.TILES_ENV):
        conv_tiles.TileChoice().find(key, (100, 64, 576, 64), "dev A", False)
    monkeypatch.delenv(conv_tiles.TILES_ENV)
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger=conv_tiles.__name__):
        assert conv_tiles.TileChoice().find(key, (100, 64, 576, 64), "dev A", False) is None
    assert "not read" in caplog.text


class _FakeTuner:
    """Stands for the autotuned kernel: runs one fixed tile, counts its launches."""

    def __init__(self, tile) -> None:
        bm, bn, bk, warps, stages = tile
        self.config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
        self.best_config = triton.Config(self.config, num_warps=warps, num_stages=stages)
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **codes) -> None:
            self.launches += 1
            g = qck.qk._grid(args[4], args[5], self.config)
            qck._conv_kernel[g](*args, **codes, **self.config, num_warps=4, num_stages=2)

        return launch


def _operands(dtype):
    gen = torch.Generator().manual_seed(7)
    n, c, h, w, c_out = 2, 64, 6, 5, 24
    if dtype == torch.int8:
        x = torch.randint(-128, 128, (n, c, h, w), dtype=torch.int8, generator=gen)
        wgt = torch.randint(-128, 128, (c_out, c, 3, 3), dtype=torch.int8, generator=gen)
    else:
        x = (torch.randn((n, c, h, w), generator=gen) * 30).clamp(-448, 448).to(F8)
        wgt = (torch.randn((c_out, c, 3, 3), generator=gen) * 30).clamp(-448, 448).to(F8)
    return x, wgt


@pytest.mark.parametrize("dtype", [torch.int8, F8], ids=["int8", "fp8"])
def test_launch_at_found_tile_skips_autotuning(dtype, tmp_path, monkeypatch) -> None:
    """`_tiled_launch` on a shape found nowhere autotunes once (the fake tuner) and records
    its tile; the same shape then runs that tile directly (no second tuning); both results
    equal torch's float64 convolution of the same values (fp8: to the GPU's fp8 sum bound)."""
    monkeypatch.setenv(conv_tiles.RECORD_ENV, str(tmp_path / "tiles.json"))
    monkeypatch.delenv(conv_tiles.TILES_ENV, raising=False)
    monkeypatch.setattr(qck, "_tiles", conv_tiles.TileChoice())
    monkeypatch.setattr(conv_tiles, "device_section", lambda index: ("test device", False))
    tuner = _FakeTuner((32, 32, 64, 4, 2))
    monkeypatch.setattr(qck, "_tuned_kernel", lambda: tuner)
    x, wgt = _operands(dtype)
    want = torch.nn.functional.conv2d(x.double(), wgt.double(), padding=1)
    size = torch.nn.functional.conv2d(x.double().abs(), wgt.double().abs(), padding=1)
    n, c_out, ho, wo = want.shape
    want, size = (t.permute(0, 2, 3, 1).reshape(-1, c_out) for t in (want, size))
    xs = x.view(torch.uint8).contiguous(memory_format=torch.channels_last).view(dtype)
    wt = wgt.view(torch.uint8).permute(0, 2, 3, 1).reshape(c_out, -1).contiguous().view(dtype)
    scale = torch.ones(c_out, device=DEVICE)
    geometry = (3, (1, 1), (1, 1), (1, 1), ho, wo)
    for launches in (1, 1):
        out = torch.full((n * ho * wo, c_out), float("nan"), device=DEVICE)
        args, codes = qck.launch_arguments(xs.to(DEVICE), wt.to(DEVICE), scale, out, geometry)
        qck._tiled_launch(args, codes, out.device)
        assert tuner.launches == launches
        err = (out.cpu().double() - want).abs()
        bound = qck.FP8_SUM_ERROR * size if DEVICE == "cuda" and dtype == F8 else 0 * size
        np.testing.assert_array_less(err.numpy(), (bound + 1e-6 * size + 1e-9).numpy())
    record = json.loads((tmp_path / "tiles.json").read_text())["test device"]
    assert list(record.values()) == [[32, 32, 64, 4, 2]]
