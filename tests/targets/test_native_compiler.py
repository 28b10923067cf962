"""The native kernel compiler (targets/native/compiler.py): build, cache, load, refuse."""

from __future__ import annotations

import ctypes
import logging
import os
import threading

import numpy as np
import pytest

from pygraphx.targets.native import compiler as nc
from pygraphx.targets.native import openmp_runtimes

pytestmark = pytest.mark.skipif(nc.compiler_command() is None, reason="no C compiler")

#: an OpenMP sum of squares: the library really runs threaded C code
SOURCE = r"""
#include <omp.h>
double sum_squares(const float *x, long n, int threads) {
    double total = 0.0;
    #pragma omp parallel for reduction(+:total) num_threads(threads)
    for (long i = 0; i < n; ++i) total += (double)x[i] * x[i];
    return total;
}
int max_threads(void) { return omp_get_max_threads(); }
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(nc.CACHE_ENV, str(tmp_path / "native"))
    monkeypatch.delenv(nc.NATIVE_ENV, raising=False)
    monkeypatch.delenv(nc.CC_ENV, raising=False)
    monkeypatch.setattr(nc, "_LOADED", {})
    return tmp_path / "native"


def _sum_squares(lib: ctypes.CDLL, x: np.ndarray, threads: int) -> float:
    fn = lib.sum_squares
    fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    return fn(x.ctypes.data, x.size, threads)


def test_builds_runs_and_caches(cache):
    x = np.random.default_rng(0).standard_normal(100_003).astype(np.float32)
    runtimes = openmp_runtimes()
    lib = nc.load_source("sumsq", SOURCE)
    assert openmp_runtimes() == runtimes  # bound to the loaded libgomp (torch's), no second one
    expected = float(np.sum(x.astype(np.float64) ** 2))
    for threads in (1, 2, 3):
        assert _sum_squares(lib, x, threads) == pytest.approx(expected, rel=1e-12)
    built = list(cache.glob("sumsq-*.so"))
    assert len(built) == 1
    assert not built[0].stat().st_mode & 0o022  # nobody else may write it
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    assert nc.load_source("sumsq", SOURCE) is lib  # memoised in the process
    mtime = built[0].stat().st_mtime_ns
    nc._LOADED.clear()  # as a new process would: loads the cached file, builds nothing
    again = nc.load_source("sumsq", SOURCE)
    assert _sum_squares(again, x, 2) == pytest.approx(expected, rel=1e-12)
    assert built[0].stat().st_mtime_ns == mtime
    nc.load_source("sumsq", SOURCE + "\n/* changed */\n")  # another source: another file
    assert len(list(cache.glob("sumsq-*.so"))) == 2


def test_concurrent_loads_build_once(cache):
    libs: list[ctypes.CDLL] = []
    threads = [threading.Thread(target=lambda: libs.append(nc.load_source("conc", SOURCE)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(libs) == 4 and all(lib is libs[0] for lib in libs)
    assert len(list(cache.glob("conc-*.so"))) == 1
    assert not list(cache.glob(".*.tmp"))


def test_disabled_and_missing_compiler_say_why(cache, monkeypatch):
    monkeypatch.setenv(nc.NATIVE_ENV, "off")
    with pytest.raises(nc.NativeUnavailable, match="disabled.*PGX_NATIVE=off"):
        nc.load_source("k", SOURCE)
    monkeypatch.setenv(nc.NATIVE_ENV, "on")
    monkeypatch.setenv(nc.CC_ENV, "/nonexistent/cc")
    with pytest.raises(nc.NativeUnavailable, match="no C compiler.*PGX_CC='/nonexistent/cc'"):
        nc.load_source("k", SOURCE)


def test_build_error_names_kernel_command_and_compiler_message(cache):
    with pytest.raises(nc.NativeUnavailable) as info:
        nc.load_source("broken", "int f(void) { return undeclared_name; }\n")
    text = str(info.value)
    assert "native kernel broken: the build failed" in text
    assert "-march=native" in text and "undeclared_name" in text
    assert not list(cache.glob("*.so")) and not list(cache.glob(".*.tmp"))


def test_build_timeout_is_bounded(cache, monkeypatch):
    monkeypatch.setenv(nc.TIMEOUT_ENV, "0.001")
    with pytest.raises(nc.NativeUnavailable, match="the build took over"):
        nc.load_source("slow", SOURCE + "\n/* timeout */\n")
    monkeypatch.setenv(nc.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="PGX_NATIVE_BUILD_TIMEOUT='soon'"):
        nc.load_source("slow", SOURCE + "\n/* bad timeout */\n")


def test_a_cached_file_others_can_write_is_never_loaded(cache):
    lib = nc.load_source("shared", SOURCE)
    path = next(cache.glob("shared-*.so"))
    os.chmod(path, 0o777)  # as if another user could have replaced it
    nc._LOADED.clear()
    again = nc.load_source("shared", SOURCE)
    assert again is not lib and os.path.dirname(again._name) != str(cache)
    x = np.ones(10, np.float32)
    assert _sum_squares(again, x, 1) == 10.0


def test_a_cache_directory_others_can_write_is_not_used(cache, caplog):
    cache.mkdir(parents=True)
    os.chmod(cache, 0o777)
    with caplog.at_level(logging.WARNING, logger="pygraphx.cpu"):
        lib = nc.load_source("opendir", SOURCE)
    assert "not private to this user" in caplog.text
    assert os.path.dirname(lib._name) != str(cache) and not list(cache.glob("*.so"))


def test_fallback_is_announced_once(caplog, monkeypatch):
    monkeypatch.setattr(nc, "_ANNOUNCED", set())
    with caplog.at_level(logging.WARNING, logger="pygraphx.cpu"):
        for _ in range(3):
            nc.announce_fallback("k", nc.NativeUnavailable("native kernel k: no C compiler"),
                                 "oneDNN's three primitives")
    lines = [r for r in caplog.records if "native kernel k" in r.getMessage()]
    assert len(lines) == 1
    assert "oneDNN's three primitives runs instead" in lines[0].getMessage()


def test_shipped_kernel_sources_are_packaged():
    # every shipped source sits where `load` looks and pyproject's package-data takes it
    assert nc.KERNELS.is_dir()
    text = (nc.KERNELS.parent.parent.parent.parent / "pyproject.toml").read_text()
    assert '"pygraphx.targets.native" = ["kernels/*.c", "kernels/*.h"]' in text
    with pytest.raises(nc.NativeUnavailable, match="cannot read"):
        nc.load("no_such_kernel")


def test_old_builds_are_pruned(cache, monkeypatch):
    monkeypatch.setattr(nc, "KEEP_BUILDS", 2)
    for k in range(4):
        nc.load_source("pruned", SOURCE + f"\n/* version {k} */\n")
        os.utime(max(cache.glob("pruned-*.so"), key=os.path.getmtime), (1e9 + k, 1e9 + k))
    assert len(list(cache.glob("pruned-*.so"))) == 2
    other = cache / ("pruned-x-" + "0" * 20 + ".so")  # another kernel, named "pruned-x"
    other.write_bytes(b"")
    stale = cache / ".pruned-0.so.1.2.tmp"  # a build killed before its rename, two hours ago
    stale.write_bytes(b"")
    os.utime(stale, (os.path.getmtime(stale) - 7200,) * 2)
    nc.load_source("pruned", SOURCE + "\n/* version 5 */\n")
    assert other.exists() and not stale.exists()


def test_private_temporary_directories_are_removed_at_exit(cache):
    cache.mkdir(parents=True)
    os.chmod(cache, 0o777)
    lib = nc.load_source("tmpdir", SOURCE)
    where = os.path.dirname(lib._name)
    assert os.path.isdir(where) and where in {str(p) for p in nc._TEMP_DIRS}
    nc._remove_temp_dirs()
    assert not os.path.exists(where)
    assert _sum_squares(lib, np.ones(4, np.float32), 1) == 4.0  # mapped: still runs


@pytest.mark.parametrize(
    "module",
    ["winograd_native", "native_mbconv", "native_layernorm"],
)
def test_failed_build_is_kept_for_the_process(module: str, monkeypatch, caplog) -> None:
    """A kernel whose build fails is tried once per process, not once per layer (a network's
    blocks / norms ask one after the other), and the fallback is said once."""
    import importlib

    from pygraphx.targets import native

    mod = importlib.import_module(f"pygraphx.targets.torch_lowering.{module}")
    calls = []

    def failing(name: str, extra_flags: object = ()) -> object:
        calls.append(name)
        raise native.NativeUnavailable(f"native kernel {name}: no compiler here (test)")

    monkeypatch.setattr(mod, "_BOUND", native.BoundLibrary(mod.KERNEL, mod._bind))
    monkeypatch.setattr(native.compiler, "load", failing)
    monkeypatch.setattr(native.compiler, "_ANNOUNCED", set())
    ask = (lambda: mod.available(False)) if module == "native_layernorm" else mod.available
    with caplog.at_level("WARNING"):
        assert not any(ask() for _ in range(5))
    assert calls == [mod.KERNEL]
    assert caplog.text.count("no compiler here (test)") == 1
    with pytest.raises(native.NativeUnavailable, match="no compiler here"):
        mod.library()
