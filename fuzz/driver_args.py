"""atheris harness: the driver's argument parsing and its cheap commands on mutated argv lists.

An input is an argv list, tokens separated by NUL bytes (`fuzz/corpus/driver`); half of the
mutations are token-level (an option of the driver's parser, a command or an odd value inserted,
a token replaced or deleted: `fuzz.targets.mutate_argv`), the rest libFuzzer's bytes. Tokens that
start with `WS:` name files in a temporary workspace holding a small ONNX model and its saved
forms (`fuzz.targets.driver_workspace`). Every argv is parsed by the driver's parser; those
naming `read`, `params`, `run`, `onnx` or `version` (no `--model`: building a built-in model is
slow) are run through `pygraphx.driver.main.main` with their output captured. A usage error
from argparse, a project error (`error: ...`) and success are clean; an `internal error: ...`
(a non-project exception), an exception out of `main`, a crash or a hang is a finding. The
driver's input budget is 64 MiB under the harness (not the machine's memory), so argv asking
for huge inputs is refused quickly. Usage (from the repository root):

    python -m fuzz.driver_args fuzz/corpus/driver -max_total_time=600 -rss_limit_mb=4096
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["pygraphx"]):
    import pygraphx.driver.commands
    import pygraphx.driver.main  # noqa: F401 (instrumented here; the harness calls it lazily)
    from fuzz.targets import driver_workspace, mixed_mutator, mutate_argv, run_driver_argv


def main() -> None:
    driver_workspace()  # made before fuzzing starts, so the first input is not slow
    mutator = mixed_mutator(mutate_argv, lambda data, n: atheris.Mutate(data, n))
    atheris.Setup(sys.argv, run_driver_argv, custom_mutator=mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
