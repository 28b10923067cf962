"""tidy18's two mended benchmarks still measure something on today's MobileNetV2:
`mnv2dw_ab.py`'s `on` variant fuses a 1x1 + depthwise pair (it had fused none: the native block
kernels take them first), and `tail12_overhead_ab.py` finds the pooling and classifier steps
on the oneDNN head route and none in the native head (whose step it had miscounted)."""

from __future__ import annotations

import importlib
import os
from unittest import mock

import pytest

pytest.importorskip("torch")


def _import(name: str):  # noqa: ANN202
    """The benchmark module, its import-time `os.environ.setdefault`s kept out of this process."""
    with mock.patch.dict(os.environ):
        return importlib.import_module(f"benchmarks.{name}")


@pytest.fixture(scope="module")
def mnv2():  # noqa: ANN201
    from benchmarks import ab_harness as ab

    return ab, ab.load("mobilenetv2:1")


def test_mnv2dw_variants_fuse_on_the_onednn_route(mnv2) -> None:  # noqa: ANN001
    ab, case = mnv2
    dw = _import("mnv2dw_ab")
    counts = {}
    for name, variant in dw.named().items():
        prog = ab.compile_variant(case, 1, variant)
        counts[name] = prog._executable.lowered.ctx.cache.get("conv_dw_fused", 0)
    assert counts["on"] >= 1 and counts["off"] == 0
    native = ab.compile_variant(case, 1, dw.named(native=True)["on"])
    assert native._executable.lowered.ctx.cache.get("conv_dw_fused", 0) == 0  # (why the switch)


def test_tail12_reports_the_onednn_tail_steps_only(mnv2) -> None:  # noqa: ANN001
    ab, case = mnv2
    tail = _import("tail12_overhead_ab")
    head = ab.compile_variant(case, 1, ab.Variant("native"))
    steps = head._executable.lowered.steps
    assert not [s for s in steps if tail.reported(s.instructions)]  # the native head: none
    assert [s for s in steps if {i.op.name for i in s.instructions} & tail.OPS]  # (it is there)
    onednn = ab.compile_variant(case, 1, ab.Variant("onednn", {"PGX_CPU_NATIVE_MBHEAD": "0"}))
    exe = onednn._executable
    picked = [k for k, s in enumerate(exe.lowered.steps) if tail.reported(s.instructions)]
    assert [[i.op.name for i in exe.lowered.steps[k].instructions] for k in picked] == [
        ["pooling"], ["dot"]]  # fmt: skip
    calls: list[float] = []
    spans = tail.count_calls(exe, calls)
    calls.append(1.0)  # a call before the run: the spans start after it
    onednn.run(case.feeds)
    at = tail.call_spans(exe, spans)
    assert len(at) == len(exe.lowered.steps)
    assert all(at[k] is not None and at[k][0] >= 1 for k in picked)
