"""save/load: round trips of parsed, optimised and compiled programs, and damaged files."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import pygraphx
from pygraphx.ir.serialize import FORMAT_VERSION, MAGIC, SerializationError
from pygraphx.passes.pipeline import optimize
from tests.helpers import make_model

RNG = np.random.default_rng(3)
X = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)


def _model() -> bytes:
    inits = {
        "w": (RNG.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32),
        "s": RNG.uniform(0.5, 1.5, 4).astype(np.float32),
        "b": RNG.standard_normal(4).astype(np.float32),
        "m": RNG.standard_normal(4).astype(np.float32),
        "v": RNG.uniform(0.5, 2, 4).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Softmax", ["r"], ["y"], axis=1),
    ]
    return make_model(nodes, {"x": X}, ["y"], inits).SerializeToString()


def _out(prog: pygraphx.Program) -> np.ndarray:
    if not prog.is_compiled():
        prog.compile(pygraphx.get_target("ref"))
    return np.array(prog.run({"x": X})[0])


@pytest.mark.parametrize("stage", ["parsed", "optimised", "compiled"])
def test_round_trip_is_bit_identical(tmp_path: Path, stage: str) -> None:
    prog = pygraphx.parse_onnx_buffer(_model())
    if stage in ("optimised", "compiled"):
        optimize(prog)
    if stage == "compiled":
        prog.compile(pygraphx.get_target("ref"))
    path = tmp_path / "m.pgx"
    pygraphx.save(prog, path)
    loaded = pygraphx.load(path)
    assert str(loaded) == str(prog)
    assert loaded.is_compiled() == (stage == "compiled")
    assert loaded.get_output_names() == prog.get_output_names()
    a, b = _out(prog), _out(loaded)
    assert a.tobytes() == b.tobytes()


def _saved(tmp_path: Path) -> bytes:
    path = tmp_path / "m.pgx"
    pygraphx.save(pygraphx.parse_onnx_buffer(_model()), path)
    return path.read_bytes()


def _load_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bad.pgx"
    path.write_bytes(data)
    pygraphx.load(path)


def test_truncated_file(tmp_path: Path) -> None:
    data = _saved(tmp_path)
    with pytest.raises(SerializationError, match="truncated"):
        _load_bytes(tmp_path, data[:-100])
    with pytest.raises(SerializationError, match="bad magic"):
        _load_bytes(tmp_path, data[:10])


def test_tampered_file(tmp_path: Path) -> None:
    data = bytearray(_saved(tmp_path))
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(SerializationError, match="checksum mismatch"):
        _load_bytes(tmp_path, bytes(data))


def test_other_format_version(tmp_path: Path) -> None:
    data = bytearray(_saved(tmp_path))
    struct.pack_into("<I", data, len(MAGIC), FORMAT_VERSION + 1)
    with pytest.raises(SerializationError, match=f"format version {FORMAT_VERSION + 1}"):
        _load_bytes(tmp_path, bytes(data))


@pytest.mark.parametrize(
    "data", [b"", b"hello world", pickle.dumps({"a": 1}), b"\x08\x07\x12\x04onnx" * 10]
)
def test_not_our_file(tmp_path: Path, data: bytes) -> None:
    with pytest.raises(SerializationError, match="not a pygraphx program file"):
        _load_bytes(tmp_path, data)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SerializationError, match="no such file"):
        pygraphx.load(tmp_path / "nope.pgx")


def test_valid_hash_but_unknown_operator_is_refused(tmp_path: Path) -> None:
    import hashlib

    import msgpack

    data = _saved(tmp_path)
    payload = data[52:].replace(b"relu", b"evil")
    header = struct.pack("<8sIQ32s", MAGIC, FORMAT_VERSION, len(payload),
                         hashlib.sha256(payload).digest())  # fmt: skip
    assert msgpack is not None
    with pytest.raises(SerializationError, match="operator 'evil'"):
        _load_bytes(tmp_path, header + payload)
