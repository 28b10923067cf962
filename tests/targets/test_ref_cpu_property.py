"""Property: random small programs compute the same values on `cpu` as on `ref` (issue 16).

The programs come from the rewrite property test's generator (`tests/passes/
test_simplify_property.py`: element-wise ops, constants broadcast from random shapes, transposes,
reshapes, reductions and matrix products, one or two outputs); each is built twice from the same
draws, compiled for `ref` (numpy, the oracle) and for `cpu` (the optimise pipeline, fusion,
torch lowering, arena), and run on the same input. Derandomised: CI sees the same examples.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pygraphx
from tests.passes.test_simplify_property import draw_twin_programs

pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(data=st.data())
def test_cpu_computes_what_ref_computes(data) -> None:
    on_ref, on_cpu, x = draw_twin_programs(data, max_dim=5)
    text = str(on_ref)
    on_ref.compile(pygraphx.get_target("ref"))
    on_cpu.compile(pygraphx.get_target("cpu"))
    want = [np.array(r) for r in on_ref.run({"x": x})]
    got = [np.array(r) for r in on_cpu.run({"x": x})]
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, text
        scale = max(1.0, float(np.max(np.abs(b))) if b.size else 1.0)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale, err_msg=text)
