"""benchmarks/README.md indexes every script of benchmarks/ (tidy18): a file the index does not
name, or an index entry whose file is gone, fails here, so the index stays current."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SUFFIXES = (".py", ".sh", ".c")
#: an index entry: a list item "- `name`: ..." or a table row "| `name` ... |" (the first cell)
ENTRY = re.compile(r"^(?:- |\| )`([^`/\s]+)`", re.MULTILINE)


def scripts(folder: Path) -> set[str]:
    """The files of `folder` the index must name (scripts and sources, not results/)."""
    return {p.name for p in folder.iterdir() if p.is_file() and p.suffix in SUFFIXES}


def entries(text: str) -> list[str]:
    """The file names the index's entries give, in order."""
    return ENTRY.findall(text)


def unindexed(files: set[str], text: str) -> tuple[list[str], list[str], list[str]]:
    """(files no entry names, entries whose file is missing, names given by two entries)."""
    named = entries(text)
    return (
        sorted(files - set(named)),
        sorted(set(named) - files),
        sorted({n for n in named if named.count(n) > 1}),
    )


def test_every_benchmark_file_is_indexed() -> None:
    text = (BENCH / "README.md").read_text()
    missing, gone, twice = unindexed(scripts(BENCH), text)
    assert not missing, f"not in benchmarks/README.md (add a line): {missing}"
    assert not gone, f"benchmarks/README.md names files that are gone: {gone}"
    assert not twice, f"benchmarks/README.md names these twice: {twice}"


def test_the_check_catches_a_missing_or_stale_entry() -> None:
    text = "| `a.py` | x |\n- `b.sh`: y\n- `c.py`: z, not `d.py`\n- `c.py`: again\n"
    assert entries(text) == ["a.py", "b.sh", "c.py", "c.py"]
    missing, gone, twice = unindexed({"a.py", "b.sh", "e.c"}, text)
    assert missing == ["e.c"] and gone == ["c.py"] and twice == ["c.py"]


def test_the_folder_is_seen() -> None:
    """The index covers the real folder (a wrong path would make the check pass vacuously)."""
    files = scripts(BENCH)
    assert {"ab.py", "ab_harness.py", "cpu_vs_peers.py", "gemm15_fma_peak.c"} <= files
    assert len(files) > 150
