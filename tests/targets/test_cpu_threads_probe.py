"""`benchmarks/cpu_threads_probe.py --ab` (issue 10): the engine list and the per-round ratios
to ORT. Each engine's own CPU time (ONNX Runtime's pool vs every other thread) is
`benchmarks/cpu_accounting.py`'s, tested in `test_cpu_accounting.py`."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
probe = pytest.importorskip("benchmarks.cpu_threads_probe")


def test_parse_engines() -> None:
    args = type("A", (), {"engines": ["on@16", "off@8", "ort@16"], "no_ort": False})()
    assert probe.parse_engines(args, 0) == [
        ("on@16", "on", 16), ("off@8", "off", 8), ("ort@16", "ort", 16)
    ]  # fmt: skip
    args.engines = None
    assert [s[0] for s in probe.parse_engines(args, 4)] == ["on@4", "off@4", "ort@4"]
    for bad in ("on16", "eager@4", "on@x"):
        args.engines = [bad]
        with pytest.raises(SystemExit, match="--engines"):
            probe.parse_engines(args, 0)


def test_over_ort_is_the_median_of_per_round_ratios() -> None:
    rng = np.random.default_rng(3)
    mine = [tuple(rng.uniform(1, 10, 3)) for _ in range(5)]
    ort = [tuple(rng.uniform(1, 10, 3)) for _ in range(5)]
    got = probe.over_ort(mine, ort)
    ratios = np.array(mine) / np.array(ort)
    for k, key in enumerate(("ms", "cpu_ms", "own_cpu_ms")):
        assert got[key] == pytest.approx(float(np.median(ratios[:, k])))
