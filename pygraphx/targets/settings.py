"""Environment settings the targets read: one validated choice among named modes."""

from __future__ import annotations

import os


def env_choice(
    name: str,
    choices: tuple[str, ...],
    default: str,
    *,
    lower: bool = False,
    error: type[ValueError] = ValueError,
) -> str:
    """The value of environment variable `name` (stripped, lower-cased where `lower`), `default`
    when unset or empty; any value outside `choices` raises `error` naming the variable."""
    raw = os.environ.get(name, default).strip()
    value = (raw.lower() if lower else raw) or default
    if value not in choices:
        raise error(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return value
