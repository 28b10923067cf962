"""Decoding with the KV cache on the device (`generate/device_loop.py`) and the weights shared by
the bucketed specializations (`targets/torch_lowering/literal_store.py`).

On CUDA: greedy tokens of the tiny GPT-2 / Llama / Qwen2 decoders on `gpu` equal transformers'.
Everywhere: the same device loop run by the gpu target on the CPU (`device="cpu"`) against
transformers and against the host loop, its in-place cache against the host cache, and one copy
of each weight across two shapes of one dynamic program.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")

from pygraphx.generate import DecoderSession, generate  # noqa: E402
from pygraphx.generate.device_loop import DeviceCache  # noqa: E402
from pygraphx.passes.derived_literals import concatenate, sources_of  # noqa: E402
from pygraphx.targets import get_target  # noqa: E402
from pygraphx.targets.torch_lowering import lower_module  # noqa: E402
from pygraphx.targets.torch_lowering.literal_store import (  # noqa: E402
    LITERALS,
    _mapped_root,
    literal_key,
)
from tests.generate.test_generate import export_tiny_decoders, hf_greedy  # noqa: E402

MODELS = ["gpt2_tiny", "llama_tiny", "qwen2_tiny"]
NEW = 32
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    """Each tiny decoder: (ONNX path, the transformers model), weights in external data."""
    return export_tiny_decoders(tmp_path_factory.mktemp("decoders_gpu"), external_data=True)


def prompts() -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(11)
    return rng.integers(0, 1000, 6).tolist(), rng.integers(0, 1000, 13).tolist()


def _check_greedy(path: Path, model: object, target: object) -> DecoderSession:
    session = DecoderSession.open(path, target, max_batch=2, max_context=64)
    assert session.device is not None  # the device loop runs, not the host one
    p1, p2 = prompts()
    want1, want2 = hf_greedy(model, p1), hf_greedy(model, p2)
    assert generate(session, p1, max_new_tokens=NEW).tolist() == want1
    both = generate(session, [p1, p2], max_new_tokens=NEW)
    assert both[0].tolist() == want1 and both[1].tolist() == want2
    return session


@cuda
@pytest.mark.parametrize("name", MODELS)
def test_gpu_greedy_matches_transformers(exported, name: str) -> None:
    path, model = exported[name]
    session = _check_greedy(path, model, "gpu")
    assert session.device.type == "cuda"
    for exe, _ in session.executables.values():
        assert exe.graph is not None, exe.why_uncaptured  # every shape replays its graph


@pytest.mark.parametrize("name", MODELS)
def test_device_loop_on_cpu_matches_transformers(exported, name: str) -> None:
    path, model = exported[name]
    _check_greedy(path, model, get_target("gpu", device="cpu"))


def test_device_loop_stops_and_sampling_match_host_loop(exported) -> None:
    path, _ = exported["qwen2_tiny"]
    dev = DecoderSession.open(path, get_target("gpu", device="cpu"), max_batch=2, max_context=64)
    host = DecoderSession.open(path, "cpu", max_batch=2, max_context=64)
    p1, p2 = prompts()
    greedy = generate(host, [p1, p2], max_new_tokens=12)
    stop = int(greedy[0][4])  # row 0 stops at its 5th token
    want = generate(host, [p1, p2], max_new_tokens=12, eos_token_id=stop)
    got = generate(dev, [p1, p2], max_new_tokens=12, eos_token_id=stop)
    assert got.tolist() == want.tolist()
    assert (got[0, 5:] == stop).all()  # padded with the stop id after it
    kw = dict(max_new_tokens=12, do_sample=True, top_k=8, top_p=0.9, temperature=0.8, seed=5)
    assert generate(dev, p1, **kw).tolist() == generate(host, p1, **kw).tolist()


def test_device_cache_written_in_place_like_host_cache(exported) -> None:
    """Prefill + 20 decode steps: the device cache's valid slots hold what the host loop's cache
    holds, the tensors are the same objects throughout (updated in place), logits agree."""
    path, _ = exported["llama_tiny"]
    dev = DecoderSession.open(path, get_target("gpu", device="cpu"), max_batch=1, max_context=64)
    host = DecoderSession.open(path, "cpu", max_batch=1, max_context=64)
    ids = np.array([[5, 17, 300, 42, 7, 9, 11, 13]], np.int64)
    ones = np.ones_like(ids)
    pos = np.arange(8)[None]
    cache = DeviceCache(dev, 1, 64, torch.device("cpu"))
    before = [t.data_ptr() for t in cache.tensors]
    hcache, valid = host.new_cache(1, 64), np.zeros((1, 64), np.int64)
    t_ids, t_one = torch.from_numpy(ids), torch.ones((1, 1), dtype=torch.int64)
    got = cache.step(0, t_ids, torch.from_numpy(ones), torch.from_numpy(pos))
    want = host.step(hcache, valid, 0, ids, ones, pos)
    for k in range(20):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
        tok = int(np.argmax(want[0]))
        got = cache.step(8 + k, torch.tensor([[tok]]), t_one, torch.tensor([[8 + k]]))
        want = host.step(hcache, valid, 8 + k, np.array([[tok]]), ones[:, :1], np.array([[8 + k]]))
    assert [t.data_ptr() for t in cache.tensors] == before
    assert cache.valid.numpy()[0, :28].all() and not cache.valid.numpy()[0, 28:].any()
    for d, h in zip(cache.tensors, hcache, strict=True):
        np.testing.assert_allclose(d.numpy()[:, :, :28], h[:, :, :28], rtol=1e-5, atol=1e-5)
        assert not d.numpy()[:, :, 28:].any()  # nothing written past the valid slots


def _specializations(path: Path) -> list:
    session = DecoderSession.open(path, "ref", max_batch=1, max_context=64)
    lay = session.layout
    prog = session.program
    out = []
    for seq, past in ((8, 16), (1, 32)):
        arrays = {"input_ids": np.zeros((1, seq), np.int64)}
        arrays["attention_mask"] = np.zeros((1, past + seq), np.int64)
        arrays["position_ids"] = np.zeros((1, seq), np.int64)
        for n in lay.past_names:
            arrays[n] = np.zeros((1, lay.kv_heads, past, lay.head_dim), lay.dtype)
        arrays = {n: a for n, a in arrays.items() if n in prog.get_parameter_shapes()}
        out.append(prog._specialized_for(arrays).get_main_module())
    return out


def _literals(ctx: object) -> list:
    return [t for t, c in zip(ctx.env, ctx.const, strict=True) if c and t.nbytes >= 4096]


def test_two_shapes_share_one_copy_of_each_weight(exported) -> None:
    """Two specializations lowered with the shared store hold the same tensor for every weight
    (external data by file offset, weights the passes concatenated by digest); without it,
    each holds its own."""
    path, _ = exported["qwen2_tiny"]
    first, second = _specializations(path)
    device = torch.device("cpu")
    uploads, hits = LITERALS.uploads, LITERALS.hits
    a = lower_module(first, device, {"share_literals": True})
    b = lower_module(second, device, {"share_literals": True})
    la, lb = _literals(a.ctx), _literals(b.ctx)
    assert len(la) == len(lb) >= 8
    assert {t.data_ptr() for t in la} == {t.data_ptr() for t in lb}
    assert {id(t) for t in la} == {id(t) for t in lb}  # the very same tensor objects
    assert LITERALS.hits - hits >= len(lb) and LITERALS.uploads - uploads <= len(la)
    kinds = {literal_key(i.get_literal().array)[0] for i in first.instructions if _big(i)}
    assert kinds == {"file", "concat"}  # mapped weights, and weights the passes concatenated
    c = lower_module(second, device, {"share_literals": False})
    assert not {id(t) for t in _literals(c.ctx)} & {id(t) for t in la}


def test_concatenated_weights_made_once_for_every_shape(exported) -> None:
    """The q/k/v and gate/up concatenations of two specializations are the same host arrays
    (made once, never hashed: their key names their mapped sources), equal to numpy's
    concatenation of the file's initialisers."""
    path, _ = exported["qwen2_tiny"]
    first, second = _specializations(path)
    cat1 = [i.get_literal().array for i in first.instructions if _concat(i)]
    cat2 = [i.get_literal().array for i in second.instructions if _concat(i)]
    assert len(cat1) == len(cat2) >= 4  # 2 layers: q/k/v and gate/up each
    assert {id(a) for a in cat1} == {id(a) for a in cat2}
    proto = onnx.load(str(path))
    weights = [onnx.numpy_helper.to_array(t) for t in proto.graph.initializer]
    for arr in cat1:
        _, sources = sources_of(arr)
        want = np.concatenate([np.array(s) for s in sources], axis=-1)
        np.testing.assert_array_equal(arr, want)
        for s in sources:  # each source is an initialiser of the file ([1, K, N]), mapped
            assert _mapped_root(s) is not None
            assert any(np.array_equal(w[None], s) for w in weights if w.ndim == 2)


def test_concatenate_of_writable_sources_is_not_shared() -> None:
    """Memory someone may still write is never matched by place: a fresh array each time."""
    a, b = np.arange(6.0).reshape(2, 3).copy(), np.ones((2, 2))
    first, again = concatenate([a, b], -1), concatenate([a, b], -1)
    assert first is not again and sources_of(first) is None
    np.testing.assert_array_equal(first, np.concatenate([a, b], -1))
    a.flags.writeable = b.flags.writeable = False
    shared = concatenate([a, b], -1)
    assert concatenate([a, b], -1) is shared and sources_of(shared)[0] == 1
    assert not shared.flags.writeable


def _concat(ins: object) -> bool:
    return _big(ins) and sources_of(ins.get_literal().array) is not None


def _big(ins: object) -> bool:
    return ins.op.name == "@literal" and ins.get_literal().array.nbytes >= 4096


def test_external_data_is_mapped_not_copied(exported, tmp_path: Path) -> None:
    """Initialisers in external data parse to read-only views of one mapping of the file."""
    from pygraphx.onnx.dynamic import parse_onnx

    path, _ = exported["gpt2_tiny"]
    prog = parse_onnx(path)
    arrays = [i.get_literal().array for i in prog.get_main_module().instructions if _big(i)]
    roots = {id(_mapped_root(a)) for a in arrays if _mapped_root(a) is not None}
    assert len(roots) == 1 and sum(_mapped_root(a) is not None for a in arrays) >= 4
    proto = onnx.load(str(path))  # the values are the file's
    by_name = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    wte = by_name[next(n for n in by_name if "wte" in n)]
    assert any(a.shape == wte.shape and np.array_equal(a, wte) for a in arrays)
