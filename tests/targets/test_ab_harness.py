"""`benchmarks/ab_harness.py` (the A/B harness every `benchmarks/*_ab.py` wraps) on a tiny model:
two variants, one round; the output comparison (against ONNX Runtime and against the first
variant) passes when the variants compute the same numbers and fails when they do not."""

from __future__ import annotations

import io
import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks import ab_harness as ab


def _model(scale: float = 1.0) -> bytes:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, 8)) * scale).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["xb"]),
        helper.make_node("Relu", ["xb"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _case() -> ab.Case:
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    return ab.Case("tiny", _model(), {"x": x})


CFG = ab.Config(threads=1, rounds=1, warmup=1)


def test_same_numbers_pass() -> None:
    out = io.StringIO()
    res = ab.ab_case(_case(), [ab.Variant("old", {"PGX_AB_TEST_UNUSED": "0"}),
                               ab.Variant("new")], CFG, out)  # fmt: skip
    assert res["ok"], out.getvalue()
    assert set(res["variants"]) == {"old", "new"}
    for fig in res["variants"].values():
        assert fig["rel_err_ort"] < 1e-6 and fig["rel_diff_first"] < 1e-6
        assert len(fig["blocks_ms"]) == 1 and fig["median_ms"] > 0
    assert "MISMATCH" not in out.getvalue()
    assert "\ntiny t1 f32, 1 rounds x 1 runs, thread CPU ms a run" in out.getvalue()


def test_different_numbers_fail() -> None:
    """`new` builds a program whose weights are scaled: it differs from `old` and from ORT."""

    def wrong(case: ab.Case, threads: int):
        return ab.compile_variant(ab.Case(case.spec, _model(1.5), case.feeds), threads,
                                  ab.Variant("x"))  # fmt: skip

    out = io.StringIO()
    res = ab.ab_case(_case(), [ab.Variant("old"), ab.Variant("new", build=wrong)], CFG, out)
    assert not res["ok"]
    assert res["mismatch"] == ["new"]
    assert res["variants"]["new"]["rel_diff_first"] > 1e-2
    assert "MISMATCH tiny new" in out.getvalue()


def test_command_line(tmp_path, capsys) -> None:
    """`benchmarks/ab.py`'s arguments on an .onnx path (seeded random feeds): exit 0 and the JSON
    written (the failing comparison: `test_different_numbers_fail`)."""
    path = tmp_path / "tiny.onnx"
    onnx.save(onnx.load_from_string(_model()), str(path))
    out = tmp_path / "ab.json"
    rc = ab.main(["--models", str(path), "--old", "PGX_AB_TEST_UNUSED=0", "--new",
                  "--threads", "1", "--rounds", "2", "--json", str(out)])  # fmt: skip
    assert rc == 0, capsys.readouterr().out
    doc = json.loads(out.read_text())
    (model,) = doc["models"]
    assert list(model["variants"]) == ["old", "new"]
    assert len(model["variants"]["new"]["blocks_ms"]) == 2


def test_parse() -> None:
    v = ab.parse_variant("old:PGX_A=0,@cpu.scheduling.X=False")
    assert v.name == "old" and v.env == {"PGX_A": "0", "@cpu.scheduling.X": "False"}
    assert ab.parse_env(["A=1,B=2", "C=3"]) == {"A": "1", "B": "2", "C": "3"}
    assert ab.rel_err([np.ones(3)], [np.ones(3)]) == 0.0


def test_settings_in_force_only_inside(monkeypatch) -> None:
    """A variant's settings (an environment variable, a module constant) hold while it compiles
    and are restored after."""
    import os

    from pygraphx.targets.cpu import scheduling

    monkeypatch.delenv("PGX_AB_TEST_X", raising=False)
    before = scheduling.SKIP_SAME_COUNT
    with ab.settings({"PGX_AB_TEST_X": "1", "@cpu.scheduling.SKIP_SAME_COUNT": repr(not before)}):
        assert os.environ["PGX_AB_TEST_X"] == "1"
        assert scheduling.SKIP_SAME_COUNT is (not before)
    assert "PGX_AB_TEST_X" not in os.environ
    assert scheduling.SKIP_SAME_COUNT is before


def test_adaptation_fixed_and_reported(tmp_path, monkeypatch, capsys) -> None:
    """`run` sets the run-time thread controls to 0 where unset and says so (header, JSON);
    `--keep-adapt` leaves them."""
    import os

    path = tmp_path / "tiny.onnx"
    onnx.save(onnx.load_from_string(_model()), str(path))
    for key in ab.ADAPT_KEYS:
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "ab.json"
    argv = ["--models", str(path), "--old", "PGX_AB_TEST_UNUSED=0", "--new", "--threads", "2",
            "--rounds", "1", "--json", str(out)]  # fmt: skip
    assert ab.main(argv) == 0
    text = capsys.readouterr().out
    assert "PGX_CPU_LOAD_ADAPT=0, PGX_CPU_STALL_ADAPT=0" in text
    doc = json.loads(out.read_text())
    assert doc["adaptation"] == {"PGX_CPU_LOAD_ADAPT": "0", "PGX_CPU_STALL_ADAPT": "0"}
    assert doc["models"][0]["adaptation"] == doc["adaptation"]
    for key in ab.ADAPT_KEYS:
        monkeypatch.delenv(key, raising=False)
    assert ab.main([*argv, "--keep-adapt"]) == 0
    assert "PGX_CPU_LOAD_ADAPT=(unset: on)" in capsys.readouterr().out
    assert "PGX_CPU_LOAD_ADAPT" not in os.environ


def test_new_first_keeps_the_reference(tmp_path, capsys) -> None:
    """`--new-first` changes the run order only: the ratios stay to `old` (the first declared)."""
    path = tmp_path / "tiny.onnx"
    onnx.save(onnx.load_from_string(_model()), str(path))
    out = tmp_path / "ab.json"
    rc = ab.main(["--models", str(path), "--old", "PGX_AB_TEST_UNUSED=0", "--new", "--threads",
                  "1", "--rounds", "1", "--new-first", "--json", str(out)])  # fmt: skip
    assert rc == 0
    (model,) = json.loads(out.read_text())["models"]
    assert model["reference"] == "old" and model["run_order"] == ["new", "old"]
    assert list(model["variants"]) == ["old", "new"]
    assert model["variants"]["old"]["ratio"] == 1.0
    new = model["variants"]["new"]
    assert new["ratio"] == new["median_ms"] / model["variants"]["old"]["median_ms"]
    assert "ratio of medians to old" in capsys.readouterr().out


def test_process_settings_refused() -> None:
    """Settings read once a process or at run time cannot be a variant's: a clear error."""
    import pytest

    for env in ({"PGX_NATIVE": "off"}, {"OMP_WAIT_POLICY": "passive"}, {"DNNL_VERBOSE": "1"},
                {"PGX_CPU_LOAD_ADAPT": "1"}, {"@lower_gemm.WIDEN_BLOCK": "1024"},
                {"@cpu.scheduling.LOAD_CHECK_S": "0.1"}):  # fmt: skip
        with pytest.raises(SystemExit, match="separate processes"):
            ab.ab_case(_case(), [ab.Variant("old"), ab.Variant("new", env)], CFG, io.StringIO())


def test_unknown_key_warned() -> None:
    out = io.StringIO()
    ab.check_settings([ab.Variant("new", {"PGX_CPU_DNNL_GEMM_JIT": "1", "PGX_CPU_GEMM": "mkl"})],
                      out)  # fmt: skip
    assert "WARNING variant new: PGX_CPU_DNNL_GEMM_JIT" in out.getvalue()
    assert "PGX_CPU_GEMM:" not in out.getvalue()


def test_bf16_tolerance_per_variant() -> None:
    """A bf16 variant beside float32 ones loosens only its own tolerance: a float32 variant 1 %
    off is still a MISMATCH (the bf16 one, within 1e-1, is not)."""

    def off(case: ab.Case, threads: int):
        return ab.compile_variant(ab.Case(case.spec, _model(1.01), case.feeds), threads,
                                  ab.Variant("x"))  # fmt: skip

    out = io.StringIO()
    variants = [ab.Variant("old"), ab.Variant("bf", bf16=True), ab.Variant("off", build=off)]
    res = ab.ab_case(_case(), variants, CFG, out)
    assert res["mismatch"] == ["off"], out.getvalue()
    figs = res["variants"]
    assert figs["old"]["tol"] == 1e-3 and figs["bf"]["tol"] == 1e-1 and figs["off"]["tol"] == 1e-3
    assert figs["bf"]["tol_first"] == 1e-1


def _wrong(case: ab.Case, threads: int):
    return ab.compile_variant(ab.Case(case.spec, _model(1.5), case.feeds), threads,
                              ab.Variant("x"))  # fmt: skip


def test_wrong_first_variant() -> None:
    """A wrong first (reference) variant: with ORT only it is blamed; with `--no-ort` the pair is
    reported, the correct one not blamed alone."""
    variants = [ab.Variant("old", build=_wrong), ab.Variant("new")]
    out = io.StringIO()
    res = ab.ab_case(_case(), variants, CFG, out)
    assert res["mismatch"] == ["old"], out.getvalue()
    assert "MISMATCH tiny new" not in out.getvalue()
    out = io.StringIO()
    res = ab.ab_case(_case(), variants, ab.Config(threads=1, rounds=1, warmup=0, ort=False), out)
    assert not res["ok"] and res["mismatch"] == ["new vs old"]
    text = out.getvalue()
    assert "MISMATCH tiny new vs old:" in text and "either may be the wrong one" in text
    assert "MISMATCH tiny new:" not in text


def test_main_exit_status_on_mismatch(tmp_path, monkeypatch) -> None:
    """`main` returns 1 when a variant's outputs are off (here `b` builds a scaled model)."""
    path = tmp_path / "tiny.onnx"
    onnx.save(onnx.load_from_string(_model()), str(path))
    compile_variant = ab.compile_variant

    def compiled(case: ab.Case, threads: int, variant: ab.Variant):
        if variant.name == "b":
            return _wrong(case, threads)
        return compile_variant(case, threads, variant)

    monkeypatch.setattr(ab, "compile_variant", compiled)
    argv = ["--models", str(path), "--variant", "a:", "--variant", "b:", "--threads", "1",
            "--rounds", "1"]  # fmt: skip
    assert ab.main(argv) == 1
    monkeypatch.setattr(ab, "compile_variant", compile_variant)
    assert ab.main(argv) == 0


def test_bf16_refused_where_a_builder_ignores_it() -> None:
    import pytest

    variants = [ab.Variant("old"), ab.Variant("new", build=_wrong)]
    cfg = ab.Config(threads=1, rounds=1, bf16=True)
    with pytest.raises(SystemExit, match="does not take --bf16"):
        ab.run([_case()], variants, cfg)


def test_refused_arguments() -> None:
    """A zoo name with a numeric batch, variant names given twice (or `OV` beside
    --openvino), and --old / --new / --variant / --new-first on a wrapper's named variants."""
    import pytest

    with pytest.raises(SystemExit, match="not a batch"):
        ab.load("minilm:8")
    with pytest.raises(SystemExit, match="given twice: a"):
        ab.run([_case()], [ab.Variant("a"), ab.Variant("a")], CFG)
    with pytest.raises(SystemExit, match="given twice: OV"):
        ab.run([_case()], [ab.Variant("a"), ab.Variant("OV")], ab.Config(threads=1, openvino=True))
    named = {"x": ab.Variant("x"), "y": ab.Variant("y", {"PGX_AB_TEST_UNUSED": "1"})}
    p = ab.parser(named=named)
    for extra in (["--old", "A=1"], ["--new"], ["--variant", "z:"], ["--new-first"]):
        with pytest.raises(SystemExit):
            p.parse_args(extra)
    assert [v.name for v in ab.variants_of(p.parse_args([]), named=named)] == ["x", "y"]


def test_spread_figures() -> None:
    """`--spread` (gpt17's figures): the 25th percentile block and the median of the rounds'
    ratios, printed and in the JSON."""
    out = io.StringIO()
    cfg = ab.Config(threads=1, rounds=3, warmup=0, spread=True)
    res = ab.ab_case(_case(), [ab.Variant("old"), ab.Variant("new")], cfg, out)
    for fig in res["variants"].values():
        assert 0 < fig["p25_ms"] <= fig["median_ms"] and fig["paired_ratio"] > 0
    assert res["variants"]["old"]["paired_ratio"] == 1.0
    assert "  new        p25 " in out.getvalue()


def test_round_order_balances_positions() -> None:
    """Two variants: reversed every round (as before); three: each in every position."""
    assert [ab.round_order(["a", "b"], r) for r in range(4)] == [["a", "b"], ["b", "a"]] * 2
    names = ["a", "b", "c"]
    orders = [ab.round_order(names, r) for r in range(6)]
    for n in names:
        assert sorted(o.index(n) for o in orders) == [0, 0, 1, 1, 2, 2]


def test_busy_during_the_timing() -> None:
    """The machine's busy share over the timing (and the others' part of it) is in the JSON."""
    res = ab.ab_case(_case(), [ab.Variant("old"), ab.Variant("new")], CFG, io.StringIO())
    during, others = res["busy_during"], res["busy_others_during"]
    assert (np.isnan(during) and np.isnan(others)) or 0.0 <= others <= during <= 1.0
    assert np.isnan(ab.busy_between([0] * 8, [0] * 8))
    assert ab.busy_between([0] * 8, [1, 0, 1, 1, 0, 0, 1, 0]) == 1 - 1 / 4



def test_run_leaves_the_adaptation_switches_as_it_found_them(tmp_path, monkeypatch) -> None:
    """`run` defaults PGX_CPU_LOAD_ADAPT / PGX_CPU_STALL_ADAPT to 0 for its own timing only: a
    caller's process (a test session, a notebook) gets its environment back (CI caught a later
    test in the same worker seeing the harness's 0)."""
    import os

    monkeypatch.delenv("PGX_CPU_LOAD_ADAPT", raising=False)
    monkeypatch.setenv("PGX_CPU_STALL_ADAPT", "1")
    path = tmp_path / "tiny.onnx"
    onnx.save(onnx.load_from_string(_model()), str(path))
    rc = ab.main(["--models", str(path), "--old", "PGX_AB_TEST_UNUSED=0", "--new",
                  "--threads", "1", "--rounds", "1"])  # fmt: skip
    assert rc == 0
    assert "PGX_CPU_LOAD_ADAPT" not in os.environ
    assert os.environ["PGX_CPU_STALL_ADAPT"] == "1"
