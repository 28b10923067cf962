"""`trace_level` reads `PGX_TRACE_EVAL` at every call (its fast path for an unset variable
looks in the mapping `os.environ` writes through to, so it follows sets and unsets)."""

from __future__ import annotations

import os

import pytest

from pygraphx.ir.trace import ENV, trace_level


def test_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert trace_level() == 0
    for raw, level in (("1", 1), ("2", 2), ("7", 7), ("", 0), ("  ", 0), ("yes", 1), ("-3", 0)):
        monkeypatch.setenv(ENV, raw)
        assert trace_level() == level, raw
    monkeypatch.delenv(ENV)
    assert trace_level() == 0
    os.environ[ENV] = "2"
    try:
        assert trace_level() == 2
    finally:
        del os.environ[ENV]
    assert trace_level() == 0
    os.environ.setdefault(ENV, "1")
    assert trace_level() == 1
    os.environ.pop(ENV)
    assert trace_level() == 0
