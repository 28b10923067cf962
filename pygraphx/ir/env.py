"""Settings read from environment variables: whole numbers, with errors that name the variable,
and on/off switches.

`PGX_CONST_FOLD_LIMIT` (bytes, passes/propagate_constant.py) and `PGX_CPU_THREADS` /
`PGX_CPU_MAX_THREADS` (threads, targets/cpu/threads.py) are read through `whole_number`, so a typo
is reported the same way wherever it is made.
"""

from __future__ import annotations

import os

#: the values that turn a switch off (`switch_on`); anything else, or unset, leaves it on
OFF_VALUES = ("0", "off", "false", "no")


def switch_on(name: str, default: bool = True) -> bool:
    """Whether the on/off switch `name` (an environment variable, on unless it is 0 / off /
    false / no, any case) is on; unset or empty, `default` (an opt-in switch: False)."""
    text = os.environ.get(name, "").strip().lower()
    return default if not text else text not in OFF_VALUES


def whole_number(name: str, text: str, minimum: int, unit: str) -> int:
    """`text`, the value of the environment variable `name`, as a whole number of `unit` of at
    least `minimum`; a ValueError naming `name` otherwise."""
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a whole number of {unit}") from None
    if n < minimum:
        least = "must not be negative" if minimum == 0 else f"must be at least {minimum}"
        raise ValueError(f"{name}={n} {least}")
    return n
