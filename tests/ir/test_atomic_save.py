"""Saving is atomic: a save killed mid-way (SIGKILL) or failing on a full disk leaves the file
that was there before loadable and unchanged; load errors name the file."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import pygraphx
from pygraphx.ir import atomic_write
from pygraphx.ir.atomic_write import AtomicWriteError, write_atomic
from pygraphx.ir.serialize import SerializationError
from tests.helpers import make_model

ROOT = Path(__file__).resolve().parents[2]


def _program(weight_elems: int, value: float) -> pygraphx.Program:
    x = np.zeros(weight_elems, np.float32)
    w = np.full(weight_elems, value, np.float32)
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": x}, ["y"], {"w": w})
    return pygraphx.parse_onnx_buffer(model.SerializeToString())


def _value_of(path: Path) -> float:
    prog = pygraphx.load(path)
    prog.compile(pygraphx.get_target("ref"))
    n = prog.get_parameter_shapes()["x"].lens()[0]
    return float(np.array(prog.run({"x": np.zeros(n, np.float32)})[0])[0])


def test_save_killed_mid_write_leaves_old_file(tmp_path: Path) -> None:
    path = tmp_path / "m.pgx"
    pygraphx.save(_program(16, 1.0), path)
    old = path.read_bytes()
    # the child saves a 16 MiB program over it and is SIGKILLed once its bytes are in the
    # temporary file (os.fsync is made to announce itself and block there)
    child = textwrap.dedent(
        f"""
        import os, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.ir.test_atomic_save import _program
        import pygraphx
        prog = _program(1 << 22, 2.0)
        def stall(fd):
            print("writing", flush=True)
            time.sleep(120)
        os.fsync = stall
        pygraphx.save(prog, {str(path)!r})
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        assert temps and temps[0].stat().st_size > (1 << 24)  # the new bytes were written
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert path.read_bytes() == old
    assert _value_of(path) == 1.0


class _FullDisk:
    """A file object whose writes fail with ENOSPC after `room` bytes."""

    def __init__(self, f, room: int) -> None:
        self.f, self.room = f, room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name: str):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def test_full_disk_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.pgx"
    pygraphx.save(_program(16, 1.0), path)
    real_fdopen = os.fdopen
    monkeypatch.setattr(
        atomic_write.os, "fdopen", lambda fd, mode: _FullDisk(real_fdopen(fd, mode), 1 << 20)
    )
    with pytest.raises(AtomicWriteError, match=r"m\.pgx: write failed .*previous file"):
        pygraphx.save(_program(1 << 20, 2.0), path)
    monkeypatch.undo()
    assert _value_of(path) == 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["m.pgx"]  # no temporary file left


def test_write_atomic_replaces_and_refuses_directory(tmp_path: Path) -> None:
    path = tmp_path / "report.txt"
    write_atomic(path, "one")
    write_atomic(path, "two")
    assert path.read_text() == "two"
    with pytest.raises(AtomicWriteError, match="is a directory"):
        write_atomic(tmp_path, b"x")


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SerializationError, match=f"{tmp_path}: is a directory"):
        pygraphx.load(tmp_path)
    with pytest.raises(SerializationError, match="/dev/zero: not a regular file"):
        pygraphx.load("/dev/zero")
    path = tmp_path / "m.pgx"
    pygraphx.save(_program(16, 1.0), path)
    data = path.read_bytes()
    cases = {
        "truncated": data[:-10],
        "bad magic": b"NOTPGX!!" + data[8:],
        "format version": data[:8] + (7).to_bytes(4, "little") + data[12:],
        "checksum mismatch": data[:-1] + bytes([data[-1] ^ 1]),
    }
    for what, bad in cases.items():
        bad_path = tmp_path / f"bad_{what.replace(' ', '_')}.pgx"
        bad_path.write_bytes(bad)
        with pytest.raises(SerializationError, match=f"{bad_path}: .*{what}"):
            pygraphx.load(bad_path)


def test_permissions_follow_umask_or_old_file(tmp_path: Path) -> None:
    old = os.umask(0o022)
    os.umask(old)
    path = tmp_path / "new.txt"
    write_atomic(path, "x")
    assert path.stat().st_mode & 0o777 == 0o666 & ~old
    path.chmod(0o640)
    write_atomic(path, "y")
    assert path.stat().st_mode & 0o777 == 0o640
