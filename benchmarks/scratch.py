"""Scratch folders for the benchmark scripts, removed when the script's process exits.

The scripts write exported models (up to ~500 MB for GPT-2) and ONNX Runtime profiles to a
temporary folder that OpenVINO / ORT read back later in the run; `tempfile.mkdtemp` alone left
every one of them behind (tens of GB of /tmp over a day of A/B runs). A folder from
`scratch_dir` lives until the process exits normally (an `atexit` hook removes it); a killed
process still leaves its folder, named `pgx-bench-*` so that it is easy to find.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_DIRS: list[Path] = []


def scratch_dir(prefix: str = "pgx-bench-") -> Path:
    """A new private folder, removed (with what is in it) when this process exits."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    _DIRS.append(path)
    return path


@atexit.register
def _remove_scratch_dirs() -> None:
    for path in _DIRS:
        shutil.rmtree(path, ignore_errors=True)
