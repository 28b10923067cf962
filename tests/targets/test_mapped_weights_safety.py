"""A model file rewritten in place while programs parsed from it live (issue: SIGBUS).

`parse_onnx(path)` keeps the weights as views of the mapped file (`onnx/mapped_model.py`). The
programs here are compiled, then the file is rewritten in place (emptied, as an export does
first; shorter; the same size with other weights) by the process itself. Runs must still give
ONNX Runtime's outputs for the original model (the weights the steps read at run time were
copied out of the file at compile: `ir/mapped.py`'s `detach_ranges`), and what must read the
file again (save, compiling a program parsed before) must raise `MappedFileChanged` naming the
file. Each scenario runs in a child process, so a SIGBUS fails the test instead of killing it."""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import pygraphx
from pygraphx.ir import mapped
from pygraphx.ir.mapped import (
    MappedFile,
    MappedFileChanged,
    detach_ranges,
    map_file,
    release_mapped,
)
from tests.helpers import run_ort
from tests.targets.test_cpu_memory import _model as mlp_model
from tests.targets.test_cpu_memory import _x as mlp_x

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="in-place copies of mapped pages need Linux"
)

VOCAB, D, OUT = 4096, 64, 256  # a 1 MiB embedding table (gathered), a 64 KiB weight


def model(seed: int = 0, vocab: int = VOCAB, batch: int | str = 2) -> onnx.ModelProto:
    """Gather rows of an embedding table (read at run time, as it is), add a position table,
    MatMul with a weight (packed at compile), add a bias, concatenate a constant row."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((vocab, D)).astype(np.float32), "emb"),
        numpy_helper.from_array(rng.standard_normal((8, D)).astype(np.float32), "pos"),
        numpy_helper.from_array(rng.standard_normal((D, OUT)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(OUT).astype(np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((1, 1, OUT)).astype(np.float32), "row"),
        numpy_helper.from_array(np.array([1, OUT], np.int64), "tile"),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"]),
        helper.make_node("Add", ["e", "pos"], ["h"]),
        helper.make_node("MatMul", ["h", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["y0"]),
        helper.make_node("Shape", ["ids"], ["ids_shape"], start=0, end=1),
        helper.make_node("Concat", ["ids_shape", "tile"], ["rows_shape"], axis=0),
        helper.make_node("Expand", ["row", "rows_shape"], ["r"]),
        helper.make_node("Concat", ["y0", "r"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [batch, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8  # ONNX Runtime builds before 1.31 read IR <= 13 only
    return m


def ids(batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, 8)).astype(np.int64)


def _target(name: str) -> object:
    return pygraphx.get_target(name, threads=1) if name == "cpu" else pygraphx.get_target(name)


def _child(path: str, scenario: str, target: str = "cpu") -> None:
    """Compile programs from `path`, rewrite it in place (`scenario`), use the programs."""
    path_ = Path(path)
    static = pygraphx.parse_onnx(path_)
    static.compile(_target(target))
    dynamic = pygraphx.parse_onnx(path_, map_dyn_input_dims={"ids": [(1, 4), 8]})
    dynamic.compile(_target(target))
    ref = pygraphx.parse_onnx(path_)
    ref.compile(pygraphx.get_target("ref"))
    later = pygraphx.parse_onnx(path_)  # compiled only after the rewrite
    new = {
        "empty": b"",
        "shorter": model(seed=1, vocab=VOCAB // 4).SerializeToString(),
        "same_size": model(seed=1).SerializeToString(),
    }[scenario]
    path_.write_bytes(new)  # in place: the same inode, truncated, then written
    out: dict[str, object] = {
        "static": np.asarray(static.run({"ids": ids(2, 1)})[0]).tolist(),
        "ref": np.asarray(ref.run({"ids": ids(2, 1)})[0]).tolist(),
        "dynamic_new_shape": np.asarray(dynamic.run({"ids": ids(3, 2)})[0]).tolist(),
    }
    for name, action in [
        ("save", lambda: pygraphx.save(static, path_.with_suffix(".pgx"))),
        ("compile", lambda: later.compile(_target(target))),
    ]:
        try:
            action()
            out[name] = "no error"
        except MappedFileChanged as exc:
            out[name] = str(exc)
    print(json.dumps(out))


def _run_child(function: str, *args: str) -> dict:
    """Run `function(*args)` of this module in a child process; what it printed (JSON)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    code = (
        f"import sys; from tests.targets.test_mapped_weights_safety import {function}; "
        f"{function}(*sys.argv[1:])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode != -signal.SIGBUS, "the child died of SIGBUS"
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


GPU = pytest.param(
    "gpu", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here")
)


@pytest.mark.parametrize("target", ["cpu", GPU])
@pytest.mark.parametrize("scenario", ["empty", "shorter", "same_size"])
def test_rewritten_model_file_no_signal_death(tmp_path: Path, scenario: str, target: str) -> None:
    path = tmp_path / "embed.onnx"
    path.write_bytes(model().SerializeToString())
    got = _run_child("_child", str(path), scenario, target)
    (want2,) = run_ort(model(), {"ids": ids(2, 1)})
    (want3,) = run_ort(model(batch="n"), {"ids": ids(3, 2)})
    for name, want in [("static", want2), ("ref", want2), ("dynamic_new_shape", want3)]:
        tol = 1e-4 if target == "cpu" or name == "ref" else 5e-3  # gpu: TF32 products
        np.testing.assert_allclose(np.array(got[name]), want, rtol=tol, atol=tol, err_msg=name)
    for name in ("save", "compile"):
        assert str(path) in got[name] and "rewritten in place" in got[name], got[name]


def if_model() -> onnx.ModelProto:
    """If(c) -> x + w else x - w: the branches read the main graph's 16 KiB `w` (a numpy
    fallback evaluates the sub-graphs at run time)."""
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [64, 64]) for n in ("t", "e")]
    then = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"])], "then", [], out[:1])
    other = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["e"])], "else", [], out[1:])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    graph = helper.make_graph(
        [node],
        "branch",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
        [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _child_if(path: str) -> None:
    prog = pygraphx.parse_onnx(Path(path))
    prog.compile(pygraphx.get_target("cpu", threads=1))
    Path(path).write_bytes(b"")
    feeds = {"c": np.array(True), "x": np.ones((64, 64), np.float32)}
    print(json.dumps({"y": np.asarray(prog.run(feeds)[0]).tolist()}))


def test_rewritten_file_under_a_branching_model(tmp_path: Path) -> None:
    path = tmp_path / "branch.onnx"
    path.write_bytes(if_model().SerializeToString())
    proc = _run_child("_child_if", str(path))
    feeds = {"c": np.array(True), "x": np.ones((64, 64), np.float32)}
    (want,) = run_ort(if_model(), feeds)
    np.testing.assert_array_equal(np.array(proc["y"], np.float32), want)


def test_replaced_by_rename_is_no_error(tmp_path: Path) -> None:
    """Writing a new file and renaming it over the old one leaves the mapped inode as it was:
    save and compile go on with the weights that were parsed."""
    path = tmp_path / "embed.onnx"
    path.write_bytes(model().SerializeToString())
    prog = pygraphx.parse_onnx(path)
    later = pygraphx.parse_onnx(path)
    fresh = tmp_path / "new.onnx"
    fresh.write_bytes(model(seed=1).SerializeToString())
    fresh.replace(path)
    later.compile(pygraphx.get_target("cpu", threads=1))
    prog.compile(pygraphx.get_target("cpu", threads=1))
    pygraphx.save(prog, tmp_path / "p.pgx")
    (want,) = run_ort(model(), {"ids": ids(2, 1)})
    for p in (prog, later, pygraphx.load(tmp_path / "p.pgx")):
        np.testing.assert_allclose(np.asarray(p.run({"ids": ids(2, 1)})[0]), want, rtol=1e-4)


def _mapped_array(tmp_path: Path, nbytes: int = 8 * mmap.PAGESIZE) -> tuple[np.ndarray, Path]:
    path = tmp_path / "blob.onnx"
    path.write_bytes(np.arange(nbytes // 4, dtype=np.float32).tobytes())
    return map_file(path)[:].view(np.float32), path


def _mapped_name(address: int) -> str | None:
    """The file /proc/self/maps names for the mapping holding `address` ('' if anonymous)."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(v, 16) for v in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) > 5 else ""
    return None


@pytest.mark.parametrize("where", ["file", "memory"])
def test_detached_pages_keep_their_bytes_through_release_and_truncation(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies in an unnamed file beside the model (large ones) and in anonymous memory (small
    ones) both survive the model file's truncation and the release of its pages."""
    monkeypatch.setattr(mapped, "SPILL_BYTES", 0 if where == "file" else 1 << 40)
    array, path = _mapped_array(tmp_path)
    want = np.arange(array.size, dtype=np.float32)
    part = array[mmap.PAGESIZE // 4 : 3 * mmap.PAGESIZE // 4]  # pages 1 and 2
    copied = detach_ranges([(part.ctypes.data, part.nbytes)])
    assert copied == 2 * mmap.PAGESIZE
    assert detach_ranges([(part.ctypes.data, part.nbytes)]) == 0  # already copied
    name = _mapped_name(part.ctypes.data)
    if where == "file":  # an unnamed file in the model's folder, not the model
        assert name.startswith(str(tmp_path)) and name.endswith("(deleted)"), name
    else:
        assert name == "", name
    release_mapped([array])  # must not drop a copy in memory (that would zero it)
    np.testing.assert_array_equal(part, want[mmap.PAGESIZE // 4 : 3 * mmap.PAGESIZE // 4])
    with path.open("r+b") as f:
        f.truncate(0)
    np.testing.assert_array_equal(part, want[mmap.PAGESIZE // 4 : 3 * mmap.PAGESIZE // 4])
    with pytest.raises(MappedFileChanged, match="blob.onnx.*size changed"):
        detach_ranges([(array.ctypes.data, array.nbytes)])


def _compiled_and_run(tmp_path: Path, m: onnx.ModelProto, feeds: dict) -> MappedFile:
    """Compile `m` from a file, run it once; the record of its mapped file."""
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    prog = pygraphx.parse_onnx(path)
    prog.compile(pygraphx.get_target("cpu", threads=1))
    prog.run(feeds)
    literals = [
        i.get_literal().array for i in prog.get_main_module().instructions if i.is_literal()
    ]
    root = max(literals, key=lambda a: a.nbytes)
    while isinstance(root.base, np.ndarray):
        root = root.base
    present = _present_pages(root.ctypes.data, len(root.base))
    info = root.pygraphx_mapped
    for lo, hi in info.detached:
        present[lo // mmap.PAGESIZE : -(-hi // mmap.PAGESIZE)] = False
    assert not present.any(), f"file pages read at run time: {np.nonzero(present)[0][:8]}"
    return info


def test_steps_read_no_page_of_the_file_the_gathered_table_is_copied(tmp_path: Path) -> None:
    """After compile and a run, no page of the model file is mapped into the process: every
    byte the steps read (the gathered table, the biases) was copied out of it."""
    info = _compiled_and_run(tmp_path, model(), {"ids": ids(2, 1)})
    assert sum(hi - lo for lo, hi in info.detached) >= VOCAB * D * 4


def test_packed_weights_are_not_copied(tmp_path: Path) -> None:
    """The MLP's two 2 MiB weights are packed for MKL / oneDNN: only the bias (one page or
    two) is copied out of the file."""
    info = _compiled_and_run(tmp_path, mlp_model(), {"x": mlp_x()})
    assert 0 < sum(hi - lo for lo, hi in info.detached) <= 2 * mmap.PAGESIZE


def _present_pages(address: int, nbytes: int) -> np.ndarray:
    first, end = address // mmap.PAGESIZE, -(-(address + nbytes) // mmap.PAGESIZE)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((end - first) * 8), dtype=np.uint64)
    return (entries >> np.uint64(63)).astype(bool)


def test_optimize_after_a_rewrite_is_the_clear_error(tmp_path: Path) -> None:
    """Passes read the weights too: optimizing a program parsed before the rewrite says so."""
    from pygraphx.passes.pipeline import optimize

    path = tmp_path / "embed.onnx"
    path.write_bytes(model().SerializeToString())
    prog = pygraphx.parse_onnx(path)
    path.write_bytes(model(seed=1, vocab=VOCAB // 2).SerializeToString())  # shorter, in place
    with pytest.raises(MappedFileChanged, match=r"embed\.onnx.*optimizing.*Parse the model again"):
        optimize(prog)


def test_no_search_for_run_time_reads_without_a_mapped_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model parsed from bytes, with no model file mapped in the process, compiles without
    searching the steps for mapped bytes (nothing could lie in a file) and matches ONNX
    Runtime; once a file is mapped, the search runs again."""
    from pygraphx.targets.torch_lowering import mapped_reads

    monkeypatch.setattr(mapped, "_ROOTS", {})  # this test's mappings only
    searched = []
    search = mapped_reads.run_time_spans
    monkeypatch.setattr(mapped_reads, "run_time_spans", lambda *a: searched.append(1) or search(*a))
    m = model()
    feeds = {"ids": ids(2, 1)}
    prog = pygraphx.parse_onnx_buffer(m.SerializeToString())
    prog.compile(_target("cpu"))
    assert searched == []
    np.testing.assert_allclose(prog.run(feeds)[0], run_ort(m, feeds)[0], rtol=1e-5, atol=1e-5)
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    from_file = pygraphx.parse_onnx(str(path))
    from_file.compile(_target("cpu"))
    assert searched == [1]
