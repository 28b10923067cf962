"""`native.BoundLibrary` with a kernel source in several files (`parts`, attn15): joined into one
translation unit, hashed as one (a changed part builds afresh), a missing part a kept failure."""

from __future__ import annotations

import ctypes

import pytest

from pygraphx.targets.native import BoundLibrary, NativeUnavailable
from pygraphx.targets.native import compiler as nc

pytestmark = pytest.mark.skipif(nc.compiler_command() is None, reason="no C compiler")

HEAD = "static int twice(int x) { return 2 * x; }\n"
TAIL = "int answer(int x) { return twice(x) + %d; }\n"


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    monkeypatch.setenv(nc.CACHE_ENV, str(tmp_path / "native"))
    monkeypatch.delenv(nc.NATIVE_ENV, raising=False)
    monkeypatch.delenv(nc.CC_ENV, raising=False)
    monkeypatch.setattr(nc, "_LOADED", {})
    where = tmp_path / "kernels"
    where.mkdir()
    monkeypatch.setattr(nc, "KERNELS", where)
    (where / "twopart.c").write_text(HEAD)
    (where / "twopart_tail.c").write_text(TAIL % 1)
    return where


def _bind(lib: ctypes.CDLL) -> None:
    lib.answer.argtypes, lib.answer.restype = [ctypes.c_int], ctypes.c_int


def test_parts_are_joined_in_order_and_hashed_as_one(kernels):
    bound = BoundLibrary("twopart", _bind, parts=("twopart_tail",))
    assert bound.source() == HEAD + TAIL % 1
    assert bound.get().answer(20) == 41
    assert bound.get() is bound.get()  # bound once
    (kernels / "twopart_tail.c").write_text(TAIL % 2)  # a changed part: a new build
    fresh = BoundLibrary("twopart", _bind, parts=("twopart_tail",))
    assert fresh.get().answer(20) == 42
    assert len(list((kernels.parent / "native").glob("twopart-*.so"))) == 2


def test_a_missing_part_is_a_failure_kept_for_the_process(kernels):
    bound = BoundLibrary("twopart", _bind, parts=("twopart_gone",))
    for _ in range(2):
        with pytest.raises(NativeUnavailable, match="cannot read .*twopart_gone.c"):
            bound.get()
    (kernels / "twopart_gone.c").write_text(TAIL % 3)
    with pytest.raises(NativeUnavailable, match="twopart_gone.c"):  # kept: not read again
        bound.get()
    bound.forget()  # as a new process: read and built
    assert bound.get().answer(1) == 5
