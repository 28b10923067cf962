"""`pygraphx.ir.env.switch_on`: the one parser of on/off environment switches."""

from __future__ import annotations

import pytest

from pygraphx.ir.env import switch_on

NAME = "PGX_TEST_SWITCH_ON"


@pytest.mark.parametrize(
    ("value", "default", "want"),
    [
        (None, True, True), (None, False, False), ("", True, True), ("", False, False),
        ("  ", False, False), ("0", True, False), ("off", True, False), ("NO", False, False),
        ("false", True, False), ("1", False, True), ("on", False, True), ("yes", False, True),
    ],
)  # fmt: skip
def test_values_and_default(monkeypatch, value, default, want) -> None:
    if value is None:
        monkeypatch.delenv(NAME, raising=False)
    else:
        monkeypatch.setenv(NAME, value)
    assert switch_on(NAME, default=default) is want
