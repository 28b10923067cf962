"""The `cpu` target (torch on the CPU) against the `ref` target: the four built-in models end
to end (rtol = atol = 1e-4: float32 sums accumulated in another order by oneDNN / MKL), and
the runtime's behaviour (arena, observer, save/load, threads, per-instruction overhead).
The op families are in test_cpu_ops.py, the fusions in test_cpu_fusions.py.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.ir.program import Program  # noqa: E402
from pygraphx.ir.shape import Shape  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget, cpu_threads  # noqa: E402
from tests.helpers import make_model  # noqa: E402
from tests.targets.cpu_compare import (  # noqa: E402
    _conv_net,
    assert_profile_matches,
    compare,
    f32,
)

# --- built-in models ------------------------------------------------------------------------


@pytest.mark.slow  # builds and runs whole networks on ref and cpu (2-25 s each)
@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2", "bert_base", "gpt2"])
def test_builtin_models_match_ref(name: str) -> None:
    from pygraphx.models import get_model, model_inputs

    model = get_model(name, batch=1, seq_len=32)
    feeds = model_inputs(name, model)
    cpu = compare(model, feeds, rtol=1e-4, atol=1e-4)
    assert cpu._executable.fallbacks == {}, "built-in models run without numpy fallbacks"


# --- runtime behaviour ----------------------------------------------------------------------


def _small_cnn() -> tuple[Program, dict[str, np.ndarray]]:
    model, feeds = _conv_net("relu", "conv")
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu"))
    return prog, feeds


def test_arena_runs_are_repeatable_and_outputs_survive() -> None:
    prog, feeds = _small_cnn()
    first = [np.array(a) for a in prog.run(feeds)]
    kept = [a.copy() for a in first]
    second = [np.array(a) for a in prog.run(feeds)]
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    other = {k: v * 2 + 1 for k, v in feeds.items()}
    third = [np.array(a) for a in prog.run(other)]
    for a, k in zip(first, kept, strict=True):
        np.testing.assert_array_equal(a, k)  # run 3 did not overwrite run 1's outputs
    assert not all(np.array_equal(a, b) for a, b in zip(first, third, strict=True))


def test_outputs_are_independent_of_the_arena_for_every_op() -> None:
    """Outputs that are arena slots, views of literals, or parameters are all copied out."""
    x = f32(3, 4)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
        helper.make_node("Identity", ["x"], ["i"]),
    ]
    model = make_model(nodes, {"x": x}, ["r", "t", "i"])
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu"))
    out = [np.array(a) for a in prog.run({"x": x})]
    saved = [a.copy() for a in out]
    prog.run({"x": -x})
    for a, b in zip(out, saved, strict=True):
        np.testing.assert_array_equal(a, b)


def test_observer_sees_every_instruction_with_values() -> None:
    prog, feeds = _small_cnn()
    assert_profile_matches(prog, feeds)


def test_save_load_reprepares_the_cpu_target(tmp_path: Any) -> None:
    prog, feeds = _small_cnn()
    want = [np.array(a) for a in prog.run(feeds)]
    path = tmp_path / "net.pgx"
    pygraphx.save(prog, path)
    loaded = pygraphx.load(path)
    assert loaded.is_compiled() and loaded.target.name == "cpu"
    got = [np.array(a) for a in loaded.run(feeds)]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_get_target_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(pygraphx.get_target("cpu"), CpuTarget)
    monkeypatch.setenv("PGX_CPU_THREADS", "3")
    assert cpu_threads() == 3
    monkeypatch.setenv("PGX_CPU_THREADS", "many")
    with pytest.raises(ValueError, match="PGX_CPU_THREADS"):
        cpu_threads()
    monkeypatch.setenv("PGX_CPU_THREADS", "0")
    with pytest.raises(ValueError, match="at least 1"):
        cpu_threads()
    monkeypatch.delenv("PGX_CPU_THREADS")
    assert cpu_threads() >= 1


def test_missing_torch_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygraphx.targets import cpu

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match="needs PyTorch"):
        cpu.make_target()


def _chain_program(n: int) -> Program:
    prog = Program()
    main = prog.get_main_module()
    y = main.add_parameter("x", Shape("float_type", [2, 2]))
    for k in range(n):
        y = main.add_instruction(pygraphx.make_op(("relu", "neg", "abs", "exp")[k % 4]), [y])
    main.add_return([y])
    return prog


def test_per_instruction_overhead(record_property: Any) -> None:
    """200 tiny instructions: the runtime's cost per instruction (torch's dispatch included).
    Reported, with a generous bound (CI machines vary); the benchmark prints the figure."""
    n = 200
    exe = CpuTarget().prepare(_chain_program(n), {})
    feeds = {"x": np.full((2, 2), 0.5, np.float32)}
    for _ in range(10):
        exe.run(feeds)
    times = []
    for _ in range(50):
        start = time.perf_counter()
        exe.run(feeds)
        times.append(time.perf_counter() - start)
    per = float(np.median(times)) / n * 1e6
    record_property("us_per_instruction", per)
    print(f"\ncpu target: {per:.2f} us per instruction ({n} tiny instructions)")
    assert per < 50.0


def test_run_checks_names_before_touching_tensors() -> None:
    prog, feeds = _small_cnn()
    with pytest.raises(pygraphx.ProgramError, match="missing parameter"):
        prog.run({})


@pytest.mark.skipif(os.cpu_count() is None, reason="needs a CPU count")
def test_prepare_takes_threads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """`PGX_CPU_THREADS` sets the program's threads; the caller's torch count is left alone
    (runs set their own count and restore the caller's: tests/targets/test_cpu_threads.py)."""
    before = torch.get_num_threads()
    monkeypatch.setenv("PGX_CPU_THREADS", "1")
    exe = CpuTarget().prepare(_chain_program(3), {})
    assert exe.threads == 1
    assert torch.get_num_threads() == before


def test_openmp_spin_is_bounded_only_when_it_can_still_act(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygraphx.targets import cpu

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    cpu.configure_openmp()  # torch is imported already: too late, nothing set
    assert "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.delitem(sys.modules, "torch")
    cpu.configure_openmp()
    assert os.environ["GOMP_SPINCOUNT"] == cpu.spincount()
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    cpu.configure_openmp()  # the user's choice stays
    assert os.environ["GOMP_SPINCOUNT"] == "5"
