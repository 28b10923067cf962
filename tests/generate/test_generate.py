"""pygraphx.generate against transformers: greedy tokens of tiny GPT-2 / Llama / Qwen2 decoders
exported with their KV cache as graph inputs/outputs, batches, stop tokens, sampling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pygraphx.generate import (  # noqa: E402
    DecoderSession,
    GenerateError,
    SamplingConfig,
    filtered_probs,
    generate,
    next_tokens,
)
from pygraphx.generate.export import export_decoder, tiny_model  # noqa: E402

MODELS = ["gpt2_tiny", "llama_tiny", "qwen2_tiny"]
TARGETS = ["ref", "cpu"] + (["gpu"] if torch.cuda.is_available() else [])
NEW = 32


def export_tiny_decoders(
    folder: Path, external_data: bool = False
) -> dict[str, tuple[Path, object]]:
    """Each tiny decoder: (ONNX path, the transformers model it came from); with
    `external_data` the weights go to `<name>.onnx.data` beside the model."""
    out = {}
    for name in MODELS:
        model = tiny_model(name)
        path = folder / f"{name}.onnx"
        export_decoder(model, path, external_data=f"{name}.onnx.data" if external_data else None)
        out[name] = (path, model)
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    """Each tiny decoder: (ONNX path, the transformers model it came from)."""
    return export_tiny_decoders(tmp_path_factory.mktemp("decoders"))


def hf_greedy(model: object, prompt: list[int], n: int = NEW) -> list[int]:
    """transformers' own greedy tokens (eager attention, DynamicCache), never stopping early."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False
        )
    return out[0, len(prompt) :].tolist()


def prompts() -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(7)
    return rng.integers(0, 1000, 5).tolist(), rng.integers(0, 1000, 11).tolist()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", MODELS)
def test_greedy_matches_transformers(exported, name: str, target: str) -> None:
    path, model = exported[name]
    session = DecoderSession.open(path, target, max_batch=2, max_context=64)
    p1, p2 = prompts()
    want1, want2 = hf_greedy(model, p1), hf_greedy(model, p2)
    assert generate(session, p1, max_new_tokens=NEW).tolist() == want1
    assert generate(session, p2, max_new_tokens=NEW).tolist() == want2
    # a batch of two prompts of different lengths (left-padded) gives the same tokens
    both = generate(session, [p1, p2], max_new_tokens=NEW)
    assert both.shape == (2, NEW)
    assert both[0].tolist() == want1 and both[1].tolist() == want2


def test_compiles_once_per_bucket(exported) -> None:
    path, _ = exported["llama_tiny"]
    session = DecoderSession.open(path, "cpu", max_batch=1, max_context=128)
    generate(session, list(range(5)), max_new_tokens=NEW)
    # prefill (1, 8, 16) (prompt padded to 8) + decode past buckets 16, 32, 64 for lengths 8..39
    assert session.shapes_seen == {(1, 8, 16), (1, 1, 16), (1, 1, 32), (1, 1, 64)}
    generate(session, list(range(10, 17)), max_new_tokens=NEW)  # 7 tokens: same shapes
    assert session.compile_count == 4


def test_stop_token_ends_row(exported) -> None:
    path, model = exported["qwen2_tiny"]
    p1, p2 = prompts()
    want = hf_greedy(model, p1)
    eos = want[4]
    first = want.index(eos)
    got = generate(path, p1, max_new_tokens=NEW, target="ref", eos_token_id=eos)
    assert got.tolist() == want[: first + 1]
    # in a batch the stopped row is padded with the pad id while the other goes on
    both = generate(
        path, [p1, p2], max_new_tokens=NEW, target="ref", eos_token_id=eos, pad_token_id=999
    )
    assert both[0, : first + 1].tolist() == want[: first + 1]
    assert (both[0, first + 1 :] == 999).all()


def test_sampling_reproducible_with_seed(exported) -> None:
    path, _ = exported["gpt2_tiny"]
    session = DecoderSession.open(path, "cpu", max_batch=2, max_context=64)
    p1, p2 = prompts()
    kw = dict(max_new_tokens=16, do_sample=True, top_k=50, top_p=0.9, temperature=1.5)
    a = generate(session, [p1, p2], seed=3, **kw)
    b = generate(session, [p1, p2], seed=3, **kw)
    c = generate(session, [p1, p2], seed=4, **kw)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    # top_k=1 sampling is greedy
    greedy = generate(session, p1, max_new_tokens=16)
    k1 = generate(session, p1, max_new_tokens=16, do_sample=True, top_k=1, seed=9)
    assert np.array_equal(greedy, k1)


def test_filtered_probs_match_transformers_warpers() -> None:
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32) * 3
    cfg = SamplingConfig(True, temperature=0.7, top_k=20, top_p=0.8)
    t = torch.from_numpy(logits.astype(np.float64))
    for warper in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.8)):
        t = warper(None, t)
    want = torch.softmax(t, dim=-1).numpy()
    np.testing.assert_allclose(filtered_probs(logits, cfg), want, rtol=1e-9, atol=1e-12)


def test_sampling_follows_the_distribution() -> None:
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    rng = np.random.default_rng(1)
    cfg = SamplingConfig(do_sample=True)
    draws = np.array([next_tokens(logits, cfg, rng)[0] for _ in range(20000)])
    freq = np.bincount(draws, minlength=4) / draws.size
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.015)


def test_text_in_text_out_with_tokenizer_json(exported, tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    path, model = exported["llama_tiny"]
    vocab = {f"w{i}": i for i in range(1000)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    (tmp_path / "model.onnx").write_bytes(path.read_bytes())
    tok.save(str(tmp_path / "tokenizer.json"))
    want = hf_greedy(model, [3, 14, 15, 92], 8)
    text = generate(tmp_path / "model.onnx", "w3 w14 w15 w92", max_new_tokens=8, target="ref")
    assert text == " ".join(f"w{i}" for i in want)


def test_text_without_tokenizer_is_refused(exported) -> None:
    path, _ = exported["llama_tiny"]
    with pytest.raises(RuntimeError, match="tokenizer.json"):
        generate(path, "hello", max_new_tokens=2, target="ref")


def test_model_without_cache_is_refused(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 4])
    out = helper.make_tensor_value_info("logits", TensorProto.INT64, [1, 4])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input_ids"], ["logits"])], "g", [ids], [out]
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(GenerateError, match="past_key_values"):
        DecoderSession.open(path, "ref")


def test_top_level_api_and_driver(exported, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import pygraphx
    from pygraphx.driver.main import main

    path, model = exported["gpt2_tiny"]
    p1, _ = prompts()
    want = hf_greedy(model, p1, 12)
    assert pygraphx.generate(path, p1, max_new_tokens=12, target="ref").tolist() == want
    args = ["generate", "--onnx", str(path), "--prompt-ids", *map(str, p1)]
    assert main([*args, "--max-new-tokens", "12", "--cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == want and report["prompt_tokens"] == len(p1)
    assert report["time_to_first_token_s"] > 0
    assert main([*args, "--sample", "--temperature", "0"]) == 1
    assert "temperature must be > 0" in capsys.readouterr().err


def test_full_logits_export_and_unbucketed_prompt(exported, tmp_path: Path) -> None:
    """A decoder exported with logits for every position (as Optimum's are) works too, and so
    does prefill at the prompt's own length."""
    from pygraphx.generate import SamplingConfig as Cfg
    from pygraphx.generate import run_generation

    _, model = exported["llama_tiny"]
    path = tmp_path / "full.onnx"
    export_decoder(model, path, last_logits_only=False)
    session = DecoderSession.open(path, "cpu", max_batch=1, max_context=64)
    p1, _ = prompts()
    res = run_generation(session, [p1], 12, Cfg(), set(), 0, None, prompt_bucket=False)
    assert res.tokens[0].tolist() == hf_greedy(model, p1, 12)
    assert (1, len(p1), 16) in session.shapes_seen


def test_context_beyond_max_context_is_refused(exported) -> None:
    path, _ = exported["llama_tiny"]
    session = DecoderSession.open(path, "ref", max_batch=1, max_context=32)
    with pytest.raises(GenerateError, match="max_context"):
        generate(session, list(range(20)), max_new_tokens=20)


def test_max_context_that_is_not_a_power_of_two(exported) -> None:
    """max_context 40 (a 16-token prompt + 24 new): the past grows 16 -> 32 -> 40, not to the
    bucket 64 the decoder was not opened for (a 7B run with prompt 128 + 64 new failed so)."""
    path, model = exported["llama_tiny"]
    prompt = np.random.default_rng(3).integers(0, 1000, 16).tolist()
    session = DecoderSession.open(path, "cpu", max_batch=1, max_context=40)
    assert generate(session, prompt, max_new_tokens=24).tolist() == hf_greedy(model, prompt, 24)
