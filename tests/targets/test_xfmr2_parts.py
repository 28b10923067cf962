"""A fused projection cut into column parts runs as one oneDNN product per part
(`lower_gemm._column_parts`), and oneDNN's attention reads a part's head views as they are
(`onednn_attention.Operand`, `permuted_dense`): every result against numpy's float64 product or
ONNX Runtime, the step taken or not taken as the rule says, the profiling path too."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import attention, lower_gemm, onednn_attention  # noqa: E402
from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16  # noqa: E402
from tests.helpers import make_model  # noqa: E402
from tests.targets.test_cpuattn_onednn_attention import (  # noqa: E402
    compile_bf16,
    oracle,
    rel_rms,
    rel_rms_np,
    small_model,
)

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch has no oneDNN here"
)
RNG = np.random.default_rng(41)
VIEW_OPS = {"reshape", "transpose", "slice"}


def projection(rows: int, widths: list[int], bias: bool = True, act: str | None = None) -> tuple:
    """`x @ w (+ b) (then act)` split along its last axis into `widths`, each part an output:
    the model, its input and the float64 parts."""
    k, n = 48, sum(widths)
    x = RNG.standard_normal((2, rows // 2, k)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    full = x.astype(np.float64) @ w + (b if bias else 0.0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m" if bias or act else "y"])]
    inits = {"w": w, "split": np.array(widths, dtype=np.int64)}
    if bias:
        nodes.append(helper.make_node("Add", ["m", "b"], ["y" if act is None else "h"]))
        inits["b"] = b
    if act is not None:
        nodes.append(helper.make_node(act, ["h" if bias else "m"], ["y"]))
        full = np.maximum(full, 0.0)
    outs = [f"p{i}" for i in range(len(widths))]
    nodes.append(helper.make_node("Split", ["y", "split"], outs, axis=-1))
    wants = np.split(full, np.cumsum(widths)[:-1], axis=-1)
    return make_model(nodes, {"x": x}, outs, inits, opset=18), x, wants


def parts_steps(prog: pygraphx.Program) -> int:
    """Steps that compute a product together with its slices (the column-parts step)."""
    names = [{i.op.name for i in s.instructions} for s in prog._executable.lowered.steps]
    return sum(1 for n in names if {"dot", "slice"} <= n)


def compile_float32(model) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    return prog


def parts_on_and_off(name: str, monkeypatch: pytest.MonkeyPatch, make) -> Iterator[tuple]:
    """The small model `name` compiled by `make` with the column parts on, then off: (on, the
    program, its inputs, ONNX Runtime's outputs)."""
    model, feeds = small_model(name)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for on in (True, False):
        if not on:
            monkeypatch.setattr(lower_gemm, "PARTS_MIN_ROWS", 1 << 40)
        yield on, make(model), feeds, want


def copied(prog: pygraphx.Program) -> set[bool]:
    """Whether the attention plans of `prog` copy their Q / K^T / V operands (each value seen)."""
    table = prog._executable.lowered.ctx.cache[attention.ONEDNN_TABLE]
    plans = [p for p in table[onednn_attention.PLANS].values() if p is not None]
    return {o.buffer is not None for p in plans for o in (p.q, p.kt, p.v)}


def run(model, x: np.ndarray, wants: list, profiled: bool = False) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    got = prog.run({"x": x})
    if profiled:
        got = prog._executable.run({"x": x}, observer=lambda ins, value, seconds: None)
    for g, w in zip(got, wants, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)
    return prog



@pytest.fixture(autouse=True)
def _onednn_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the oneDNN / torch routes: blocks stay off the native kernel that
    runs first (`test_native_attention.py`)."""
    monkeypatch.setenv("PGX_CPU_NATIVE_ATTENTION", "0")

@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts of 16 columns and more count (the small models' width)."""
    monkeypatch.setattr(lower_gemm, "PARTS_MIN_WIDTH", 16)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("widths", [[32, 32, 32], [16, 80]])
@pytest.mark.parametrize("profiled", [False, True])
def test_parts_of_a_projection(narrow: None, bias: bool, widths: list, profiled: bool) -> None:
    model, x, wants = projection(32, widths, bias=bias)
    assert parts_steps(run(model, x, wants, profiled)) == 1


def test_a_group_beyond_the_bias_stays_one_product(narrow: None) -> None:
    model, x, wants = projection(32, [32, 32, 32], act="Relu")
    assert parts_steps(run(model, x, wants)) == 0


def test_few_rows_or_narrow_parts_stay_one_product(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, wants = projection(32, [32, 32, 32])
    assert parts_steps(run(model, x, wants)) == 0  # parts narrower than PARTS_MIN_WIDTH
    monkeypatch.setattr(lower_gemm, "PARTS_MIN_WIDTH", 16)
    model, x, wants = projection(8, [32, 32, 32])  # 8 rows: below PARTS_MIN_ROWS
    assert parts_steps(run(model, x, wants)) == 0


def test_slices_that_do_not_cover_the_columns_stay_views(narrow: None) -> None:
    x = RNG.standard_normal((2, 16, 48)).astype(np.float32)
    w = RNG.standard_normal((48, 96)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Slice", ["y", "s0", "e0", "ax"], ["a"]),
        helper.make_node("Slice", ["y", "s1", "e1", "ax"], ["c"]),
    ]
    one = np.array([1], dtype=np.int64)
    inits = {"w": w, "s0": 0 * one, "e0": 32 * one, "s1": 16 * one, "e1": 96 * one, "ax": -one}
    model = make_model(nodes, {"x": x}, ["a", "c"], inits, opset=18)
    full = x.astype(np.float64) @ w
    assert parts_steps(run(model, x, [full[..., :32], full[..., 16:]])) == 0  # overlapping


def test_permuted_dense() -> None:
    t = torch.empty(2, 5, 3, 4)
    assert onednn_attention.permuted_dense(t)
    assert onednn_attention.permuted_dense(t.transpose(1, 2))
    assert onednn_attention.permuted_dense(t[:1].permute(0, 2, 3, 1))
    assert not onednn_attention.permuted_dense(t[..., :2])  # gaps
    assert not onednn_attention.permuted_dense(t[:, :1].expand(2, 5, 3, 4))  # overlaps


@pytest.mark.parametrize("b", [1, 3])
def test_head_views_of_their_own_products_are_read_as_they_are(b: int) -> None:
    """Q, K^T, V as head views of three (b, s, h * d) tensors: no copies, oneDNN's brgemm
    matmuls, the block against float64."""
    h, s, d = 4, 32, 16
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(b, s, h * d, generator=g).view(b, s, h, d).transpose(1, 2)
               for _ in range(3))  # fmt: skip
    kt = k.transpose(-1, -2)
    mask = torch.where(torch.rand(b, 1, 1, s, generator=g) < 0.3, -1e4, 0.0).expand(b, h, s, s)
    table: dict = {}
    got = onednn_attention.attend(0.25, table, attention._sdpa(0.25, torch.float32))(q, kt, v, mask)
    (plan,) = table[onednn_attention.PLANS].values()
    assert [o.buffer for o in (plan.q, plan.kt, plan.v)] == [None, None, None]
    assert all(impl.startswith("brg") for impl in plan.prims.impls[::2]), plan.prims.impls
    assert rel_rms(got, oracle(q, kt, v, mask, 0.25)) < 1e-5


def test_a_permuted_operand_without_brgemm_is_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where oneDNN would read a permuted operand through another matmul, the plan copies it."""
    real = onednn_attention.Primitives.__init__

    def fake_impls(self, rt, key):
        real(self, rt, key)
        permuted = any(layout[1] != onednn_attention.dense_strides(layout[0])
                       for layout in (key[0][0], key[0][2]))  # fmt: skip
        if permuted:
            self.impls = ["gemm:jit:f32", *self.impls[1:]]

    monkeypatch.setattr(onednn_attention.Primitives, "__init__", fake_impls)
    q, k, v = (torch.randn(1, 32, 64).view(1, 32, 4, 16).transpose(1, 2) for _ in range(3))
    table: dict = {}
    got = onednn_attention.attend(0.25, table, attention._sdpa(0.25, torch.float32))(
        q, k.transpose(-1, -2), v, None
    )
    (plan,) = table[onednn_attention.PLANS].values()
    assert plan.q.buffer is not None and plan.v.buffer is not None
    assert rel_rms(got, oracle(q, k.transpose(-1, -2), v, None, 0.25)) < 1e-5


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_transformer_attention_reads_its_parts_uncopied(
    name: str, narrow: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32 BERT (Q / K / V merged by the passes) and GPT-2 (one `c_attn` product): with
    the parts on, the attention blocks copy nothing and the parts' head splits (reshape,
    transpose) take no steps of their own; off, they copy Q, K and V; both against ONNX Runtime,
    the profiling path too."""
    monkeypatch.setattr(attention, "ONEDNN_F32_MIN", 1024)
    copies, views = {}, {}
    for on, prog, feeds, want in parts_on_and_off(name, monkeypatch, compile_float32):
        # (the pooler's output of a profiled run was its group's arena slot, which the next
        # run overwrote: `CpuExecutable.run` copies a profiled run's outputs)
        profiled = prog._executable.run(feeds, observer=lambda ins, value, seconds: None)
        for got in (prog.run(feeds), profiled):
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
        steps = prog._executable.lowered.steps
        views[on] = sum(1 for s in steps if {i.op.name for i in s.instructions} <= VIEW_OPS)
        blocks = [s for s in steps if [i.op.name for i in s.instructions].count("dot") == 2]
        assert len(blocks) == 2  # each block merges its heads back in its own step
        assert all({"transpose", "reshape"} <= {i.op.name for i in s.instructions} for s in blocks)
        copies[on] = copied(prog)
        assert (parts_steps(prog) == 2) == on  # two layers
    assert copies == {True: {False}, False: {True}}
    assert views[True] <= views[False] - 2 * 6  # Q, K, V: a reshape and a transpose each


@pytest.mark.skipif(not cpu_has_bf16(), reason="needs a processor with bf16 instructions")
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_bf16_transformer_parts(name: str, narrow: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 program (`quantize_bf16`): its Q / K / V parts are bf16 products of their own, read
    uncopied; the outputs as close to ONNX Runtime's float32 ones as with the fused product.
    (The oneDNN route's copies: the native kernel that runs first reads any head view.)"""
    monkeypatch.setenv("PGX_CPU_NATIVE_ATTENTION", "0")
    errors, copies = {}, {}
    for on, prog, feeds, want in parts_on_and_off(name, monkeypatch, compile_bf16):
        got = prog.run(feeds)
        errors[on] = max(rel_rms_np(g, w) for g, w in zip(got, want, strict=True))
        copies[on] = copied(prog)
        assert (parts_steps(prog) == 2) == on
    assert copies == {True: {False}, False: {True}}
    assert 1e-5 < errors[True] < 3e-2
    assert errors[True] <= 1.05 * errors[False]
