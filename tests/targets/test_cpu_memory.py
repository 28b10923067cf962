"""Weights held once (issue 10, memory): a model parsed from its file reads its initialisers as
views of the mapped file (`onnx/mapped_model.py`), and after the cpu target has packed them no
numpy copy of a big weight is alive and the file's pages are no longer resident
(`ir/mapped.py`). Results, save/load and dynamic re-compiles are checked against ONNX Runtime."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import pygraphx
from pygraphx.ir.instruction import reachable
from pygraphx.onnx.errors import OnnxParseError
from pygraphx.onnx.mapped_model import BUFFER_LOCATION, MIN_MAPPED_BYTES, read_model_mapped
from pygraphx.targets.torch_lowering.literal_store import literal_key
from tests.helpers import run_ort
from tests.targets.gpu.test_gpu_memory import _held_children  # containers and closures

K, N = 512, 1024  # a 2 MiB float32 weight


def _model(batch: int | str = 4) -> onnx.ModelProto:
    """x @ w1 + b, relu, @ w2: two big weights (MKL/oneDNN pack them), a small bias, and a
    small shape initialiser given as int64_data (not raw bytes)."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((K, N)).astype(np.float32)
    w2 = rng.standard_normal((N, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, K])
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["hb"]),
            helper.make_node("Relu", ["hb"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y0"]),
            helper.make_node("Reshape", ["y0", "shape"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(b, "b"),
            shape,
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _save(model: onnx.ModelProto, tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _x(batch: int = 4) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((batch, K)).astype(np.float32)


def _mapped(array: np.ndarray) -> bool:
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, mmap.mmap)


def _literals(prog: pygraphx.Program) -> list[np.ndarray]:
    return [i.get_literal().array for i in prog.get_main_module().instructions if i.is_literal()]


def _nbytes(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, torch.Tensor) and not x.is_mkldnn and x.device.type == "cpu":
        return x.untyped_storage().nbytes()
    return 0


def _in_mapping(x: Any) -> bool:
    """Whether the memory of array or tensor `x` lies in a mapped file."""
    if isinstance(x, np.ndarray):
        return _mapped(x)
    address = x.untyped_storage().data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(v, 16) for v in fields[0].split("-"))
            if lo <= address < hi:
                return len(fields) >= 6 and fields[5].endswith(".onnx")
    return False


def _resident_bytes(array: np.ndarray) -> int:
    """Bytes of `array`'s pages mapped into this process now (/proc/self/pagemap's present
    bit; readable without privileges)."""
    first, end = (
        array.ctypes.data // mmap.PAGESIZE,
        -(-(array.ctypes.data + array.nbytes) // mmap.PAGESIZE),
    )
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((end - first) * 8), dtype=np.uint64)
    return int((entries >> np.uint64(63)).sum()) * mmap.PAGESIZE


def test_initialisers_are_views_of_the_file(tmp_path: Path) -> None:
    model = _model()
    path = _save(model, tmp_path)
    prog = pygraphx.parse_onnx(path)
    big = [a for a in _literals(prog) if a.nbytes >= MIN_MAPPED_BYTES]
    assert len(big) == 3 and all(_mapped(a) for a in big)
    expected = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    by_shape = {a.shape: a for a in big}
    for name in ("b", "w1", "w2"):
        np.testing.assert_array_equal(by_shape[expected[name].shape], expected[name])
    # the parse holds no proto: the bytes it decoded left every big initialiser in the file
    stripped = read_model_mapped(path)
    assert stripped is not None and len(stripped) < 4096 < path.stat().st_size


def test_after_compile_no_copy_of_a_packed_weight_and_no_resident_pages(tmp_path: Path) -> None:
    path = _save(_model(), tmp_path)
    prog = pygraphx.parse_onnx(path)
    prog.compile(pygraphx.get_target("cpu", threads=1))
    ctx = prog._executable.lowered.ctx
    packed = {id(t) for t in reachable(ctx.packed_weights.values(), _held_children)}
    roots = [ctx.env, [s.fn for s in ctx.steps], _literals(prog)]
    copies = [
        x
        for x in reachable(roots, _held_children)
        if id(x) not in packed and _nbytes(x) >= K * N * 4 and not _in_mapping(x)
    ]
    assert copies == [], "a copy of a packed weight is still held by the program"
    weights = [a for a in _literals(prog) if a.nbytes >= K * N * 4]
    assert len(weights) == 2 and all(_mapped(a) for a in weights)
    if sys.platform.startswith("linux"):
        assert all(_resident_bytes(a) <= 2 * mmap.PAGESIZE for a in weights)
    x = _x()
    (expected,) = run_ort(_model(), {"x": x})
    np.testing.assert_allclose(np.asarray(prog.run({"x": x})[0]), expected, rtol=1e-4, atol=1e-3)


def test_save_and_load_after_compile_read_the_weights_again(tmp_path: Path) -> None:
    path = _save(_model(), tmp_path)
    prog = pygraphx.parse_onnx(path)
    prog.compile(pygraphx.get_target("cpu", threads=1))
    saved = tmp_path / "mlp.pgx"
    pygraphx.save(prog, saved)
    path.unlink()  # the saved program carries its weights: the model file is not needed
    loaded = pygraphx.load(saved)
    x = _x()
    (expected,) = run_ort(_model(), {"x": x})
    np.testing.assert_allclose(np.asarray(loaded.run({"x": x})[0]), expected, rtol=1e-4, atol=1e-3)


def test_dynamic_recompiles_from_the_mapped_weights(tmp_path: Path) -> None:
    path = _save(_model("batch"), tmp_path)
    prog = pygraphx.parse_onnx(path, map_dyn_input_dims={"x": [(1, 8), K]})
    prog.compile(pygraphx.get_target("cpu", threads=1))
    for batch in (8, 3, 1):
        x = _x(batch)
        (expected,) = run_ort(_model("batch"), {"x": x})
        got = np.asarray(prog.run({"x": x})[0])
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)
    saved = tmp_path / "dyn.pgx"
    pygraphx.save(prog, saved)
    path.unlink()  # the specializer's model carries its weights inline, not the file's name
    loaded = pygraphx.load(saved)
    x = _x(2)
    (expected,) = run_ort(_model("batch"), {"x": x})
    np.testing.assert_allclose(np.asarray(loaded.run({"x": x})[0]), expected, rtol=1e-4, atol=1e-3)


def test_map_weights_off_reads_the_file_whole(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PGX_MAP_WEIGHTS", "0")
    path = _save(_model(), tmp_path)
    assert read_model_mapped(path) is None
    prog = pygraphx.parse_onnx(path)
    assert not any(_mapped(a) for a in _literals(prog))
    prog.compile(pygraphx.get_target("cpu", threads=1))
    x = _x()
    (expected,) = run_ort(_model(), {"x": x})
    np.testing.assert_allclose(np.asarray(prog.run({"x": x})[0]), expected, rtol=1e-4, atol=1e-3)


def test_truncated_file_is_still_a_parse_error(tmp_path: Path) -> None:
    data = _model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    assert read_model_mapped(path) is None  # the scanner leaves it to the protobuf decoder
    with pytest.raises(OnnxParseError, match="cut.onnx"):
        pygraphx.parse_onnx(path)


def _held_by_bytes(array: np.ndarray) -> bool:
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, bytes)


def test_buffer_initialisers_are_views_of_the_bytes() -> None:
    model = _model()
    data = model.SerializeToString()
    prog = pygraphx.parse_onnx_buffer(data)
    big = [a for a in _literals(prog) if a.nbytes >= MIN_MAPPED_BYTES]
    assert len(big) == 3 and all(_held_by_bytes(a) for a in big)
    prog.compile(pygraphx.get_target("cpu", threads=1))
    x = _x()
    (expected,) = run_ort(model, {"x": x})
    np.testing.assert_allclose(np.asarray(prog.run({"x": x})[0]), expected, rtol=1e-4, atol=1e-3)


def test_buffer_location_of_the_user_is_not_read_from_the_bytes() -> None:
    """A tensor that names the buffer location itself (not one the scanner left in place) is
    external data, which a buffer cannot have: the usual error, no read of the bytes."""
    model = _model()
    w1 = model.graph.initializer[0]
    w1.ClearField("raw_data")
    w1.data_location = TensorProto.EXTERNAL
    for key, value in (("location", BUFFER_LOCATION), ("offset", "0"), ("length", str(K * N * 4))):
        entry = w1.external_data.add()
        entry.key, entry.value = key, value
    with pytest.raises(OnnxParseError, match="cannot be read from a buffer"):
        pygraphx.parse_onnx_buffer(model.SerializeToString())


def test_raw_data_of_the_wrong_length_is_a_parse_error(tmp_path: Path) -> None:
    model = _model()
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]
    with pytest.raises(OnnxParseError, match="'w1' is corrupt"):
        pygraphx.parse_onnx_buffer(model.SerializeToString())
    with pytest.raises(OnnxParseError, match="w1"):
        pygraphx.parse_onnx(_save(model, tmp_path))


def test_device_store_keys_a_replaced_or_deleted_file_by_the_mapped_bytes(tmp_path: Path) -> None:
    """The device literal store identifies a mapped weight by the file as it was mapped: a
    model file replaced after the parse (same name, same size, new weights) gives a different
    key, and a deleted one still has a key."""
    path = _save(_model(), tmp_path)
    old = max(_literals(pygraphx.parse_onnx(path)), key=lambda a: a.nbytes)
    changed = _model()
    for w in changed.graph.initializer[:2]:  # w1 and w2
        w.raw_data = (numpy_helper.to_array(w) + 1).astype(np.float32).tobytes()
    fresh = tmp_path / "new.onnx"
    fresh.write_bytes(changed.SerializeToString())
    fresh.replace(path)  # same path and size, other weights
    new = max(_literals(pygraphx.parse_onnx(path)), key=lambda a: a.nbytes)
    assert not np.array_equal(old, new)
    assert literal_key(old) != literal_key(new)
    path.unlink()
    assert literal_key(old) is not None and literal_key(old)[0] == "file"
