"""`native.compiler.inline_headers` (helper gelu16): a kernel's `#include "x.h"` of a header in
`kernels/` is pasted into the source before hashing and building, so a changed header builds
afresh; a header included twice is pasted once; a missing one is `NativeUnavailable`."""

from __future__ import annotations

import shutil

import pytest

from pygraphx.targets.native import compiler as nc

SOURCE = '''#include <stdint.h>
#include "twice.h"
#include "twice.h"
int answer(void) { return TWICE(21); }
'''


def test_inline_headers(monkeypatch, tmp_path) -> None:
    (tmp_path / "twice.h").write_text('#include "base.h"\n#define TWICE(x) (BASE * (x))\n')
    (tmp_path / "base.h").write_text("#define BASE 2\n")
    monkeypatch.setattr(nc, "KERNELS", tmp_path)
    text = nc.inline_headers("k", SOURCE)
    assert "#include <stdint.h>" in text  # (system headers stay)
    assert '#include "' not in text
    assert text.count("#define TWICE") == 1 and text.count("#define BASE 2") == 1
    assert "twice.h: included above" in text
    with pytest.raises(nc.NativeUnavailable, match="missing.h"):
        nc.inline_headers("k", '#include "missing.h"\n')


@pytest.mark.skipif(nc.compiler_command() is None, reason="needs a C compiler")
def test_header_change_builds_afresh(monkeypatch, tmp_path) -> None:
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    monkeypatch.setattr(nc, "KERNELS", kernels)
    monkeypatch.setenv(nc.CACHE_ENV, str(tmp_path / "cache"))
    (kernels / "base.h").write_text("#define BASE 2\n")
    (kernels / "twice.h").write_text('#include "base.h"\n#define TWICE(x) (BASE * (x))\n')
    lib = nc.load_source("inc16", SOURCE)
    assert lib.answer() == 42
    (kernels / "base.h").write_text("#define BASE 3\n")
    assert nc.load_source("inc16", SOURCE).answer() == 63
    shutil.rmtree(kernels)


def test_shipped_kernels_headers_exist() -> None:
    """Every quoted include of a shipped kernel names a header that is there."""
    for path in nc.KERNELS.glob("*.c"):
        nc.inline_headers(path.stem, path.read_text())
