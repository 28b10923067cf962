"""The conv tile record (`targets/gpu/conv_tiles.py`) ignores entries that are not tiles."""

from __future__ import annotations

import json
import logging

import pytest

from pygraphx.targets.gpu import conv_tiles
from pygraphx.targets.gpu import quant_conv_kernels as qck


@pytest.mark.parametrize(
    "bad",
    [
        [64, 64, 64, 4],
        [64, 64, "64", 4, 5],
        [64, 64, 0, 4, 5],
        [True] * 5,
        7,
        [64, 64, 64, 4, 5, 9],
    ],
)
def test_malformed_record_entry_is_announced_and_ignored(
    bad, tmp_path, monkeypatch, caplog
) -> None:
    """A hand-edited or foreign record's entry that is not 5 positive integers is never
    launched: the lookup warns and falls through (no table off Hopper: autotune)."""
    path = tmp_path / "tiles.json"
    key = conv_tiles.tile_key(False, qck.IMPLICIT, 100, 64, 576, 64)
    path.write_text(json.dumps({"dev A": {key: bad}}))
    monkeypatch.setenv(conv_tiles.RECORD_ENV, str(path))
    monkeypatch.delenv(conv_tiles.TILES_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger=conv_tiles.__name__):
        assert conv_tiles.TileChoice().find(key, (100, 64, 576, 64), "dev A", False) is None
    assert "ignored" in caplog.text
    for good in ([64, 64, 64, 4, 5], [64, 64, 64, 4, 2, conv_tiles.PRE]):
        path.write_text(json.dumps({"dev A": {key: good}}))
        found = conv_tiles.TileChoice().find(key, (100, 64, 576, 64), "dev A", False)
        assert found == tuple(good)


@pytest.mark.parametrize("content", [[1, 2], {"dev A": "x"}, "text"])
def test_record_of_another_shape_is_announced_and_ignored(content, tmp_path, monkeypatch, caplog):
    """A record file whose JSON is not {section: {key: tile}} is ignored with a warning."""
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps(content))
    monkeypatch.setenv(conv_tiles.RECORD_ENV, str(path))
    monkeypatch.delenv(conv_tiles.TILES_ENV, raising=False)
    key = conv_tiles.tile_key(False, qck.IMPLICIT, 100, 64, 576, 64)
    with caplog.at_level(logging.WARNING, logger=conv_tiles.__name__):
        assert conv_tiles.TileChoice().find(key, (100, 64, 576, 64), "dev A", False) is None
    assert "ignored" in caplog.text
