"""torch's CPU allocator on transparent huge pages (`targets/cpu/__init__.py`,
`configure_allocator`): `import pygraphx` sets `THP_MEM_ALLOC_ENABLE=1` before torch loads, the
kernel then backs a large tensor with huge pages (its own accounting, `AnonHugePages`, is the
oracle), and the user's choice, pygraphx's switch and a late call leave the variable alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pygraphx.targets import cpu

ROOT = Path(__file__).resolve().parents[2]

#: a fresh interpreter: import pygraphx, touch a 64 MiB tensor, report the variable, the
#: setting line and the process's huge pages (kB) before and after
CHILD = """
import json, os, sys
import pygraphx
import torch
from pygraphx.targets.cpu import allocator_setting

def huge():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0

before = huge()
t = torch.ones(16 << 20)  # 64 MiB, written: faulted in
after = huge()
print(json.dumps({"var": os.environ.get("THP_MEM_ALLOC_ENABLE"), "setting": allocator_setting(),
                  "gained_kb": after - before, "sum": float(t[::4096].sum())}))
"""


def _child(extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (cpu.THP_ENV, cpu.HUGE_PAGES_ENV)}
    env.update(extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _sysfs() -> str:
    try:
        return Path(cpu.THP_SYSFS).read_text()
    except OSError:
        return ""


needs_thp = pytest.mark.skipif(
    not cpu._thp_offered(), reason="the kernel offers no transparent huge pages"
)


@needs_thp
def test_import_pygraphx_puts_large_tensors_on_huge_pages() -> None:
    got = _child({})
    assert got["var"] == "1"
    assert got["setting"] == f"{cpu.THP_ENV}=1 (set by pygraphx)"
    assert got["sum"] == 16 << 20 >> 12  # the tensor holds what was written
    # the kernel's count: most of the 64 MiB tensor on 2 MiB pages (the ends may not align)
    assert got["gained_kb"] >= 32 << 10, got


@needs_thp
@pytest.mark.skipif("[always]" in _sysfs(), reason="every mapping gets huge pages anyway")
def test_the_users_choice_and_the_switch_keep_default_pages() -> None:
    got = _child({cpu.THP_ENV: "0"})
    assert got["var"] == "0"
    assert got["setting"] == f"{cpu.THP_ENV}=0 (from the environment)"
    assert got["gained_kb"] < 8 << 10, got
    got = _child({cpu.HUGE_PAGES_ENV: "0"})
    assert got["var"] is None
    assert got["setting"] == f"torch's default pages ({cpu.HUGE_PAGES_ENV}=0)"
    assert got["gained_kb"] < 8 << 10, got


def test_too_late_once_torch_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch  # noqa: F401

    monkeypatch.delenv(cpu.THP_ENV, raising=False)
    monkeypatch.delenv(cpu.HUGE_PAGES_ENV, raising=False)
    monkeypatch.setattr(cpu, "_allocator", "")
    assert not cpu.configure_allocator()
    assert cpu.THP_ENV not in os.environ
    assert "imported before pygraphx" in cpu.allocator_setting()


def test_a_kernel_without_huge_pages_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    never = tmp_path / "enabled"
    never.write_text("always madvise [never]\n")
    monkeypatch.delenv(cpu.THP_ENV, raising=False)
    monkeypatch.delenv(cpu.HUGE_PAGES_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(cpu, "_allocator", "")
    assert not cpu.configure_allocator(str(never))
    assert cpu.THP_ENV not in os.environ
    assert "offers no transparent huge pages" in cpu.allocator_setting()
    madvise = tmp_path / "madvise"
    madvise.write_text("always [madvise] never\n")
    assert cpu.configure_allocator(str(madvise))
    assert os.environ[cpu.THP_ENV] == "1"
    assert cpu.configure_allocator(str(madvise))  # a second call: still pygraphx's setting
    assert cpu.allocator_setting() == f"{cpu.THP_ENV}=1 (set by pygraphx)"


def test_thp_offered_reads_the_selected_mode(tmp_path: Path) -> None:
    f = tmp_path / "enabled"
    for text, offered in (("[always] madvise never", True), ("always [madvise] never", True),
                          ("always madvise [never]", False)):  # fmt: skip
        f.write_text(text)
        assert cpu._thp_offered(str(f)) is offered
    assert not cpu._thp_offered(str(tmp_path / "missing"))
