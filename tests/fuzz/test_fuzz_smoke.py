"""The fuzz harnesses run briefly in CI (a fixed seed and number of runs, so a CI run is
reproducible: a finding is found again by the same command): any non-project exception fails.
The saved crash inputs of earlier sessions are replayed as regression cases. Long, randomised
runs are `fuzz/run_for.sh` (fuzz/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "harness, corpus, runs",
    [("onnx_parser", "onnx", 20000), ("pgx_load", "pgx", 20000), ("driver_args", "driver", 200)],
)  # the driver runs a command per input (~10-50 ms): fewer runs keep it to a few seconds
def test_harness_runs_clean(harness: str, corpus: str, runs: int, tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            f"fuzz.{harness}",
            str(tmp_path),
            str(ROOT / "fuzz" / "corpus" / corpus),
            "-seed=1",
            f"-runs={runs}",
            "-max_total_time=60",
            "-timeout=20",
            "-rss_limit_mb=4096",
            f"-artifact_prefix={tmp_path}/",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.parametrize(
    "path", sorted((ROOT / "fuzz" / "regressions").glob("*")), ids=lambda p: p.name
)
def test_earlier_findings_are_refused_cleanly(path: Path) -> None:
    from fuzz.targets import load_pgx_bytes, parse_onnx_bytes

    data = path.read_bytes()
    (load_pgx_bytes if path.name.startswith("pgx-") else parse_onnx_bytes)(data)
