"""Bugs in `benchmarks/ab_harness.py` found by review17a, each reproduced on a tiny model.

Both were `xfail(strict=True)` until the harness was mended (tidyfix17): the marks are gone.
"""

from __future__ import annotations

import io

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from benchmarks import ab_harness as ab


def _two_outputs(small_scale: float) -> bytes:
    """x -> MatMul -> Relu -> (big: 256x512, small: 256x4); `small_scale` scales the small
    head's weights only (1.5: that output 50 % off, the big one exact)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((512, 512)) / 20).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((512, 512)) / 20).astype(np.float32), "w2")
    ws = rng.standard_normal((512, 4)) * small_scale / 20
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["big"]),
        helper.make_node("MatMul", ["r", "ws"], ["small"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 512])],
        [
            helper.make_tensor_value_info("big", TensorProto.FLOAT, [256, 512]),
            helper.make_tensor_value_info("small", TensorProto.FLOAT, [256, 4]),
        ],
        [w1, w2, numpy_helper.from_array(ws.astype(np.float32), "ws")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_wrong_small_output_fails_bf16() -> None:
    """A bf16 variant whose second (small) output is 50 % off must be a MISMATCH; the pooled
    rel. RMS over all outputs (~0.05) is under the bf16 tolerance (0.1), so it passes."""
    x = np.random.default_rng(1).standard_normal((256, 512)).astype(np.float32)
    case = ab.Case("two", _two_outputs(1.0), {"x": x})

    def wrong(c: ab.Case, threads: int):
        return ab.compile_variant(ab.Case(c.spec, _two_outputs(1.5), c.feeds), threads,
                                  ab.Variant("x", bf16=True))  # fmt: skip

    out = io.StringIO()
    variants = [ab.Variant("old", bf16=True), ab.Variant("new", bf16=True, build=wrong)]
    res = ab.ab_case(case, variants, ab.Config(threads=1, rounds=1, warmup=0), out)
    assert not res["ok"], out.getvalue()
    assert "MISMATCH two new" in out.getvalue()
    fig = res["variants"]["new"]
    assert fig["rel_err_ort_output"] == "small" and fig["rel_err_ort"] > 0.3
    assert fig["rel_err_ort_pooled"] < 0.1  # the pooled figure that hid it, still in the JSON
    assert "(output 'small')" in out.getvalue()


def _conv3() -> bytes:
    """Three 3x3 convolutions + ReLU: the cpu target chains them (`conv_chain.py`), so the
    executor has fewer steps than `lowered.steps`."""
    rng = np.random.default_rng(0)
    inits, nodes, prev = [], [], "x"
    for i in range(3):
        w = (rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        inits.append(numpy_helper.from_array((rng.standard_normal(16) / 10).astype(np.float32),
                                             f"b{i}"))  # fmt: skip
        nodes.append(helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"],
                                      pads=[1, 1, 1, 1]))  # fmt: skip
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "conv3",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 16, 32, 32])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_steps_on_chained_convolutions() -> None:
    x = np.random.default_rng(1).standard_normal((1, 16, 32, 32)).astype(np.float32)
    case = ab.Case("conv3", _conv3(), {"x": x})
    out = io.StringIO()
    cfg = ab.Config(threads=1, rounds=1, warmup=0, steps=True, ort=False)
    res = ab.ab_case(case, [ab.Variant("old"), ab.Variant("new", {"PGX_AB_TEST_UNUSED": "1"})],
                     cfg, out)  # fmt: skip
    assert res["ok"] and res["steps_ms"], out.getvalue()
    assert res["steps_error"] is None
    for per in res["steps_ms"].values():
        assert sum(per.values()) > 0
    text = out.getvalue()
    assert text.index(" rounds x ") < text.index("  kind "), text  # the table first


def test_steps_failure_keeps_the_table(monkeypatch) -> None:
    """A failure of `--steps` is said, and the timing table is already out."""
    x = np.random.default_rng(1).standard_normal((1, 16, 32, 32)).astype(np.float32)
    case = ab.Case("conv3", _conv3(), {"x": x})

    def broken(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr(ab, "_steps", broken)
    out = io.StringIO()
    cfg = ab.Config(threads=1, rounds=1, warmup=0, steps=True, ort=False)
    res = ab.ab_case(case, [ab.Variant("old"), ab.Variant("new")], cfg, out)
    text = out.getvalue()
    assert "conv3 t1 f32, 1 rounds x 1 runs" in text and "--steps FAILED (ValueError: boom)" in text
    assert res["steps_error"] == "ValueError: boom" and res["ok"]
