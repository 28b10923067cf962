"""A float32 attention block on the native kernel writing its arena slot (`attention._slot`,
helper tfov17): `Plan.run` into a given tensor against float64; BERT- and GPT-2-style programs
(32-wide heads, 197 tokens as ViT's: not a multiple of 16 / 32; padding and causal masks) against
ONNX Runtime, batch 1 and 3, 1 and 2 threads, three runs with another input between (a stale or
shared slot shows); which blocks took a slot, and that they wrote it (after each run the slot is
still the block's env value, and every kernel call was given it and returned it; review17c); a
returned merged view; refused operands' fallback copied into the slot; `PGX_CPU_ATTENTION_SLOT=0`
keeps new tensors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import attention, native_attention  # noqa: E402

GEN = torch.Generator().manual_seed(1717)


def _f32_or_skip():
    try:
        return native_attention.kernel(torch.float32)
    except native.NativeUnavailable as exc:
        pytest.skip(str(exc))


def model(name: str, batch: int, seq: int) -> tuple:
    """A 2-layer BERT or GPT-2 (hidden 64, 2 heads of 32), the last sequence padded, and a
    function giving its inputs for a seed."""
    from pygraphx.models.bert import BertConfig, build_bert
    from pygraphx.models.gpt2 import GPT2Config, build_gpt2

    def feeds(seed: int) -> dict:
        ids = np.random.default_rng(seed).integers(0, 100, (batch, seq)).astype(np.int64)
        keep = np.ones_like(ids)
        keep[-1, seq - seq // 3 :] = 0
        out = {"input_ids": ids, "attention_mask": keep}
        if name == "bert":
            out["token_type_ids"] = ids * 0
        return out

    sizes = {"hidden": 64, "layers": 2, "heads": 2, "vocab_size": 100}
    if name == "gpt2":
        config = GPT2Config(**sizes, n_positions=256)
        m = build_gpt2(batch=batch, seq_len=seq, seed=7, config=config)
    else:
        cfg = BertConfig(**sizes, intermediate=128)
        m = build_bert(batch=batch, seq_len=seq, seed=7, config=cfg)
    return m, feeds


def _spy_slots(monkeypatch) -> tuple[list, list]:
    """`attention._slot`'s answers (a tensor or None per block) and `Plan.run`'s calls (the
    `out` it was given, what it returned), recorded."""
    slots: list = []
    calls: list = []
    real_slot, real_run = attention._slot, native_attention.Plan.run

    def slot(*args):
        out = real_slot(*args)
        slots.append(out)
        return out

    def run(self, q, kt, v, mask, out=None):
        y = real_run(self, q, kt, v, mask, out)
        calls.append((out, y))
        return y

    monkeypatch.setattr(attention, "_slot", slot)
    monkeypatch.setattr(native_attention.Plan, "run", run)
    return slots, calls


def _check_slots_written(prog, slots: list, calls: list) -> None:
    """After a run: each slot is still its block's env value (the step did not rebind it to
    another tensor) and every kernel call with a slot wrote that very tensor (review17c)."""
    env = prog._executable.lowered.ctx.env
    given = [t for t in slots if t is not None]
    for t in given:
        assert any(x is t for x in env), "a block's env value is not its slot"
    if given:
        assert calls, "no kernel call"
        for out, y in calls:
            assert any(out is t for t in given), "the kernel was not given the slot"
            assert y is out
    calls.clear()


def _run(monkeypatch, name: str, batch: int, seq: int, threads: int) -> list[bool]:
    """The program against ORT over three runs (another input between); which blocks took a
    slot (and that those blocks wrote it, `_check_slots_written`)."""
    monkeypatch.setattr(attention, "ONEDNN_F32_MIN", 1)  # the small blocks on the kernel too
    slots, calls = _spy_slots(monkeypatch)
    m, feeds = model(name, batch, seq)
    data = m.SerializeToString()
    sess = ort.InferenceSession(data)
    prog = pygraphx.parse_onnx_buffer(data)
    prog.compile(CpuTarget(threads=threads))
    table = prog._executable.lowered.ctx.cache.get(attention.NATIVE_TABLE, {})
    for seed in (1, 2, 1):
        f = feeds(seed)
        want = sess.run(None, f)
        got = prog.run(f)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=2e-4, atol=2e-4)
        _check_slots_written(prog, slots, calls)
    assert any(p is not None for p in table.get(native_attention.PLANS, {}).values())
    return [t is not None for t in slots]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name,seq", [("bert", 197), ("bert", 128), ("gpt2", 197)])
def test_blocks_write_their_slots_against_ort(monkeypatch, name, seq, batch, threads) -> None:
    _f32_or_skip()
    took = _run(monkeypatch, name, batch, seq, threads)
    assert took == [True, True], took


def test_switch_keeps_new_tensors(monkeypatch) -> None:
    _f32_or_skip()
    monkeypatch.setenv(native_attention.SLOT_ENV, "0")
    took = _run(monkeypatch, "bert", 3, 197, 2)
    assert took == [False, False], took


def test_no_slot_without_the_float32_kernel(monkeypatch) -> None:
    """Where the float32 variant cannot be had, no block takes a slot (each run would copy the
    route's result into it); the program still matches ORT."""
    _f32_or_skip()
    monkeypatch.setattr(native_attention, "f32_available", lambda: False)
    took = _run(monkeypatch, "bert", 1, 197, 1)
    assert took == [False, False], took


def _operands(b: int, h: int, s: int, d: int) -> tuple:
    q = torch.randn(b, s, h, d, generator=GEN).transpose(1, 2)
    kt = torch.randn(b, s, h, d, generator=GEN).permute(0, 2, 3, 1)
    v = torch.randn(b, s, h, d, generator=GEN).transpose(1, 2)
    return q, kt, v


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1, 12, 197, 64), (3, 2, 197, 32), (2, 12, 128, 32)])
def test_plan_writes_the_given_tensor_against_float64(threads, shape) -> None:
    fn = _f32_or_skip()
    b, h, s, d = shape
    q, kt, v = _operands(b, h, s, d)
    mask = torch.zeros(b, 1, 1, s)
    mask[-1, ..., s - s // 3 :] = -1e4
    scale = d**-0.5
    want = torch.softmax((q.double() @ kt.double()) * scale + mask.double(), -1) @ v.double()
    plan = native_attention.Plan(fn, scale, q, kt, v, mask, threads)
    out = torch.full((b * s * h * d,), float("nan")).as_strided(
        plan.out_shape, native_attention.out_layout(plan.out_shape))
    for _ in range(2):
        got = plan.run(q, kt, v, mask, out)
        assert got is out
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="the plan writes"):
        plan.run(q, kt, v, mask, torch.empty(plan.out_shape))


def attention_model(b: int, s: int, h: int, d: int):
    """Q, K, V (b, s, h d) inputs, heads split, softmax(q k^T / sqrt d) v, heads merged back:
    the merged view is the program's output."""
    from onnx import TensorProto, helper

    init = [helper.make_tensor("shp4", TensorProto.INT64, [4], [b, s, h, d]),
            helper.make_tensor("shp3", TensorProto.INT64, [3], [b, s, h * d]),
            helper.make_tensor("scale", TensorProto.FLOAT, [], [d**-0.5])]  # fmt: skip
    node = helper.make_node
    nodes = [node("Reshape", [n, "shp4"], [n + "4"]) for n in "qkv"]
    nodes += [node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
              node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
              node("MatMul", ["qh", "kt"], ["sc"]), node("Mul", ["sc", "scale"], ["ss"]),
              node("Softmax", ["ss"], ["p"], axis=-1), node("MatMul", ["p", "vh"], ["o"]),
              node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              node("Reshape", ["ot", "shp3"], ["y"])]  # fmt: skip
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, s, h * d]) for n in "qkvy"]
    graph = helper.make_graph(nodes, "attention", io[:3], io[3:], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
def test_returned_merged_view_takes_the_slot_and_outlives_the_next_run(monkeypatch, threads):
    """The block's merged view as the program output: the block takes its slot (review17c: the
    program-output check `_slot` had never fired), and a run's output is the program's own (the
    end of the run copies a non-fresh view): still right after the next run with other inputs."""
    _f32_or_skip()
    monkeypatch.setattr(attention, "ONEDNN_F32_MIN", 1)
    slots, calls = _spy_slots(monkeypatch)
    data = attention_model(2, 37, 2, 32).SerializeToString()
    sess = ort.InferenceSession(data)
    prog = pygraphx.parse_onnx_buffer(data)
    prog.compile(CpuTarget(threads=threads))
    assert [t is not None for t in slots] == [True]
    rng = np.random.default_rng(threads)
    feeds = [{n: rng.standard_normal((2, 37, 64)).astype(np.float32) for n in "qkv"}
             for _ in range(2)]  # fmt: skip
    first = prog.run(feeds[0])[0]
    _check_slots_written(prog, slots, calls)
    second = prog.run(feeds[1])[0]
    _check_slots_written(prog, slots, calls)
    for got, f in ((first, feeds[0]), (second, feeds[1])):
        np.testing.assert_allclose(np.asarray(got), sess.run(None, f)[0], rtol=1e-5, atol=1e-5)


def test_refused_operands_copy_the_fallback_into_the_slot() -> None:
    """Operands the kernel refuses at run time (Q's d axis not dense) with a slot given: the
    fallback runs and its result is copied into the slot, every run (review17c: the slot is
    given at lowering time, before the operands are seen; `attend`'s docstring says so)."""
    _f32_or_skip()
    b, h, s, d = 1, 2, 37, 32
    q = torch.randn(b, h, d, s, generator=GEN).transpose(-1, -2)  # d axis strided
    _, kt, v = _operands(b, h, s, d)
    assert native_attention.refusal(q, kt, v, None) is not None
    scale = d**-0.5
    want = torch.softmax((q.double() @ kt.double()) * scale, -1) @ v.double()
    calls: list[int] = []

    def fallback(q, kt, v, mask):
        calls.append(1)
        return torch.softmax((q @ kt) * scale, -1) @ v

    shape = (b, h, s, d)
    out = torch.full((b * s * h * d,), float("nan")).as_strided(
        shape, native_attention.out_layout(shape))
    run = native_attention.attend(scale, {}, fallback, torch.float32, "a test route", out=out)
    for n in (1, 2):
        got = run(q, kt, v, None)
        assert got is out and len(calls) == n
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
