"""The `pygraphx-driver` command line as a MIGraphX user types it, run as a real process.

Every test runs `python -m pygraphx ...` (the `pygraphx-driver` entry point) in a subprocess and
checks the exit status and the message. The model is a small CNN written to `ResNet50.onnx` in
a temporary folder, so the `migraphx-driver` command lines of MIGraphX's own documentation run
as written, only faster; values are compared with numpy where a command prints them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import pygraphx

REPO = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
FC = RNG.standard_normal((5, 4)).astype(np.float32)


def cnn_model(batch: int | str = "N") -> onnx.ModelProto:
    """input: float[N, 3, 16, 16] -> conv 3x3 (4) -> relu -> global average pool -> gemm (5)."""
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc"], ["output"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, 5])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(FC, "fc")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cli(
    *argv: str, cwd: Path | str = REPO, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`pygraphx-driver argv...` in a fresh process (stdout and stderr are pipes)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pygraphx", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
        check=False,
        input=stdin,
    )


def has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ResNet50.onnx (the small CNN) and ResNet50.mxr (it, compiled for ref)."""
    path = tmp_path_factory.mktemp("seeds")
    onnx.save(cnn_model(), path / "ResNet50.onnx")
    prog = pygraphx.parse_onnx(path / "ResNet50.onnx")
    prog.compile(pygraphx.get_target("ref"))
    pygraphx.save(prog, path / "ResNet50.mxr")
    return path


# --- 0. MIGraphX's documented command lines, as written -----------------------------------------
_PERF = "perf --enable-offload-copy --batch 2 --input-dim @input 2 3 16 16 -n 3 --fp16"
SEED_LINES = [
    # (command line after `migraphx-driver`, a fragment of stdout)
    (
        "compile --enable-offload-copy --binary --output ./ResNet50.mxr --onnx ./ResNet50.onnx",
        "Wrote: ResNet50.mxr (saved program compiled for ref, binary",
    ),
    ("params --onnx ./ResNet50.onnx", "input: float_type, {1, 3, 16, 16}, {768, 256, 16, 1}"),
    ("params --migraphx ./ResNet50.mxr", "output: float_type, {1, 5}, {5, 1}"),
    ("version", "Program file format version: 1"),
    ("version --migraphx ./ResNet50.mxr", "format version: 1 (this pygraphx"),
    ("onnx -l", "Conv"),
    ("read --onnx ResNet50.onnx", "convolution[padding={1, 1, 1, 1}"),
    ("read --migraphx ./ResNet50.mxr", 'module: "main"'),
    ("perf --enable-offload-copy -h", "--enable-offload-copy"),
    (f"{_PERF} --cpu --onnx ./ResNet50.onnx", "Batch size: 2 (first dimension of input"),
    (f"{_PERF} --gpu --onnx ./ResNet50.onnx", "Batch size: 2 (first dimension of input"),
    ("perf --enable-offload-copy -n 3 --onnx ./ResNet50.onnx", "Summary:"),
    ("--version", "pygraphx version: "),
]


@pytest.mark.parametrize(("line", "expected"), SEED_LINES, ids=[s[0] for s in SEED_LINES])
def test_migraphx_driver_command_lines_run_as_written(
    folder: Path, line: str, expected: str
) -> None:
    if "--gpu" in line.split() and not has_gpu():
        pytest.skip("no GPU: torch sees no CUDA/ROCm device")
    proc = cli(*line.split(), cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert expected in proc.stdout, proc.stdout


def test_version_of_a_saved_program(folder: Path) -> None:
    proc = cli("version", "--migraphx", "ResNet50.mxr", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "File: ResNet50.mxr",
        f"Program file format version: 1 (this pygraphx {pygraphx.__version__} reads 1: "
        "compatible)",
        f"Written by pygraphx version: {pygraphx.__version__}",
        "Compiled for target: ref",
    ]
    bad = folder / "text.mxr"
    bad.write_text('module: "main"\n')
    proc = cli("version", "--migraphx", str(bad))
    assert proc.returncode == 1
    assert "not a saved pygraphx program (bad magic number)" in proc.stderr


# --- 2, 3. a positional model file, -o, formats from the extension -------------------------------
def test_positional_file_compile_o_then_run(tmp_path: Path) -> None:
    onnx.save(cnn_model(1), tmp_path / "m.onnx")
    proc = cli("compile", "m.onnx", "-o", "m.pgx", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Wrote: m.pgx (saved program compiled for ref, binary" in proc.stdout
    run = cli("run", "m.pgx", "--fill1", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "Reading: m.pgx (saved program)" in run.stdout
    # all-ones input: conv sums 27 weights per filter, relu, mean over 16x16 (edges pad 0)
    x = np.ones((1, 3, 16, 16), np.float32)
    expected = np.asarray(reference_cnn(x))
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("  min: "))
    assert float(line.split(",")[0].split()[-1]) == pytest.approx(expected.min(), rel=1e-4)


def reference_cnn(x: np.ndarray) -> np.ndarray:
    """The CNN in numpy (the oracle for the driver's printed values)."""
    n, _, h, w = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros((n, 4, h, w), np.float64)
    for i in range(3):
        for j in range(3):
            patch = padded[:, :, i : i + h, j : j + w]
            conv += np.einsum("nchw,oc->nohw", patch, W[:, :, i, j])
    pooled = np.maximum(conv, 0).mean(axis=(2, 3))
    return pooled @ FC.T


def test_perf_positional_onnx(tmp_path: Path) -> None:
    onnx.save(cnn_model(), tmp_path / "model.onnx")
    proc = cli("perf", "model.onnx", "-n", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Reading: model.onnx" in proc.stdout and "Summary:" in proc.stdout


@pytest.mark.parametrize(
    ("name", "flags", "kind"),
    [
        ("out.pgx", [], "binary"),
        ("out.mxr", [], "binary"),
        ("out.txt", [], "text"),
        ("out.json", [], "json"),
        ("out.prog", [], "text"),
        ("out.prog", ["--binary"], "binary"),
    ],
)
def test_compile_output_format_from_extension(
    tmp_path: Path, name: str, flags: list[str], kind: str
) -> None:
    onnx.save(cnn_model(), tmp_path / "m.onnx")
    proc = cli("compile", "m.onnx", "--output", name, *flags, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    written = tmp_path / name
    if kind == "binary":
        assert f"Wrote: {name} (saved program compiled for ref, binary" in proc.stdout
        assert pygraphx.load(written).is_compiled()
        return
    assert f"Wrote: {name} (compiled program for ref, {kind}:" in proc.stdout
    text = written.read_text()
    if kind == "json":
        doc = json.loads(text)
        assert doc["target"] == "ref" and any("convolution" in ln for ln in doc["modules"]["main"])
    else:
        assert text.startswith('module: "main"')


def test_loading_text_as_a_program_names_binary(tmp_path: Path) -> None:
    onnx.save(cnn_model(), tmp_path / "m.onnx")
    assert cli("compile", "m.onnx", "-o", "m.txt", cwd=tmp_path).returncode == 0
    proc = cli("run", "--migraphx", "m.txt", cwd=tmp_path)
    assert proc.returncode == 1
    assert "bad magic number" in proc.stderr
    assert "--binary" in proc.stderr and ".pgx/.mxr" in proc.stderr
    clash = cli("compile", "m.onnx", "-o", "m.txt", "--binary", cwd=tmp_path)
    assert clash.returncode == 1 and "name it .pgx or .mxr" in clash.stderr


@pytest.mark.parametrize("command", ["read", "params", "compile", "run", "time", "perf", "verify"])
def test_every_command_help_shows_examples(command: str) -> None:
    proc = cli(command, "--help")
    assert proc.returncode == 0
    examples = proc.stdout.split("examples:\n", 1)[1].splitlines()
    assert examples and all(ln.startswith("  pygraphx-driver ") for ln in examples if ln)


def test_model_given_twice_or_not_at_all(tmp_path: Path) -> None:
    onnx.save(cnn_model(), tmp_path / "m.onnx")
    twice = cli("params", "m.onnx", "--onnx", "m.onnx", cwd=tmp_path)
    assert twice.returncode == 2 and "the model is given twice" in twice.stderr
    none = cli("params")
    assert none.returncode == 2 and "give the model: a FILE" in none.stderr


# --- 5, 6. dynamic and symbolic dimensions, rank, hints ------------------------------------------
def reshape_model() -> onnx.ModelProto:
    """x: float[B, 8] reshaped to [4, 4, -1]: needs B even (B = 1 cannot be reshaped)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    shape = numpy_helper.from_array(np.array([4, 4, -1], np.int64), "s")
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")
    graph = helper.make_graph([node], "reshape", [x], [y], [shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_defaulted_symbolic_dimension_is_named_in_the_error(tmp_path: Path) -> None:
    onnx.save(reshape_model(), tmp_path / "r.onnx")
    proc = cli("run", "r.onnx", cwd=tmp_path)
    assert proc.returncode == 1
    assert "Symbolic dimensions: x[0] 'B' = 1 (default)" in proc.stderr
    assert "cannot reshape" in proc.stderr
    assert "(note: symbolic dimensions were defaulted: x[0] 'B' = 1 (default);" in proc.stderr
    ok = cli("run", "r.onnx", "--batch", "2", "--fill1", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "Symbolic dimensions: x[0] 'B' = 2 (--batch/--default-dim-value)" in ok.stderr
    assert "y: float_type, {4, 4, 1}" in ok.stdout


@pytest.mark.parametrize(
    ("flags", "symbol", "largest"),
    [
        (["--dyn-input-dim", "@input", "1:4", "3", "16", "16"], "{1..4} (--dyn-input-dim)", 4),
        (
            ["--dyn-input-dim", "@input", "{1,4,2}", "3", "16", "16"],
            "{1..4, optimals [2]} (--dyn-input-dim)",
            4,
        ),
        (["--default-dyn-dim-value", "2:6"], "{2..6} (--default-dyn-dim-value)", 6),
        (["--input-dim", "@input", "5", "3", "16", "16"], "1..5 (--input-dim: the largest", 5),
    ],
)
def test_dynamic_dimensions(tmp_path: Path, flags: list[str], symbol: str, largest: int) -> None:
    onnx.save(cnn_model(), tmp_path / "m.onnx")
    proc = cli("params", "m.onnx", *flags, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"Symbolic dimensions: input[0] 'N' = {symbol}" in proc.stderr
    assert f"input: float_type, {{{largest}, 3, 16, 16}}" in proc.stdout  # the largest shape


def test_dynamic_dimensions_run_against_numpy(tmp_path: Path) -> None:
    onnx.save(cnn_model(), tmp_path / "m.onnx")
    proc = cli("run", "m.onnx", "--default-dyn-dim-value", "1:3", "--fill1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    expected = reference_cnn(np.ones((3, 3, 16, 16), np.float32))  # run at the maximum lens
    assert "output: float_type, {3, 5}, {5, 1}" in proc.stdout
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("  min: "))
    assert float(line.split(",")[1].split()[-1]) == pytest.approx(expected.max(), rel=1e-4)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--input-dim", "@input", "1", "3", "200"],
            "input 'input' has rank 3, the model expects 4",
        ),
        (["--dyn-input-dim", "@input", "1", "4", "3", "16", "16"], "write min:max"),
        (["--dyn-input-dim", "@input", "{4,1}", "3", "16", "16"], "needs 1 <= min <= max"),
    ],
)
def test_shape_option_errors(tmp_path: Path, flags: list[str], message: str) -> None:
    onnx.save(cnn_model(), tmp_path / "m.onnx")
    proc = cli("run", "m.onnx", *flags, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and message in proc.stderr
    assert "Traceback" not in proc.stderr and "strides" not in proc.stderr


def test_unsupported_operator_hint_is_the_cli_flag(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("FooBar", ["x"], ["y"], name="foo")], "g", [x], [y])
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "f.onnx"
    )
    proc = cli("read", "f.onnx", cwd=tmp_path)
    assert proc.returncode == 1
    assert "ai.onnx::FooBar (opset 17): foo" in proc.stderr
    assert "--skip-unknown-operators parses anyway" in proc.stderr
    assert "skip_unknown_operators=True" not in proc.stderr
    skipped = cli("read", "f.onnx", "--skip-unknown-operators", cwd=tmp_path)
    assert skipped.returncode == 0, skipped.stderr


def test_batch_on_a_fixed_batch_model_warns(tmp_path: Path) -> None:
    onnx.save(cnn_model(1), tmp_path / "m.onnx")
    proc = cli("params", "m.onnx", "--batch", "8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "warning: --batch 8: the model's inputs have no symbolic dimension" in proc.stderr
    assert "--input-dim @input N 3 16 16" in proc.stderr
    assert "input: float_type, {1, 3, 16, 16}" in proc.stdout
    onnx.save(cnn_model(), tmp_path / "n.onnx")
    symbolic = cli("params", "n.onnx", "--batch", "8", cwd=tmp_path)
    assert "warning" not in symbolic.stderr and "{8, 3, 16, 16}" in symbolic.stdout


# --- 6b. integer inputs drawn from what consumes them --------------------------------------------
def token_model(table: int = 10) -> onnx.ModelProto:
    """ids: int64[1, 6] index a [table, 4] embedding; types: int64[1, 6] a [2, 4] one; mask:
    int64[1, 6] is cast to bool and selects the sum or 0."""
    rng = np.random.default_rng(1)
    emb = numpy_helper.from_array(rng.standard_normal((table, 4)).astype(np.float32), "emb")
    typ = numpy_helper.from_array(rng.standard_normal((2, 4)).astype(np.float32), "typ")
    zero = numpy_helper.from_array(np.zeros((1, 6, 4), np.float32), "zero")
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"], name="word_embedding"),
        helper.make_node("Gather", ["typ", "types"], ["t"], name="type_embedding"),
        helper.make_node("Add", ["e", "t"], ["s"], name="add"),
        helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.BOOL, name="mask_bool"),
        helper.make_node("Unsqueeze", ["m", "axes"], ["m3"], name="unsqueeze"),
        helper.make_node("Where", ["m3", "s", "zero"], ["y"], name="where"),
    ]
    axes = numpy_helper.from_array(np.array([2], np.int64), "axes")
    ins = [
        helper.make_tensor_value_info(n, TensorProto.INT64, [1, 6])
        for n in ("ids", "types", "mask")
    ]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 4])]
    graph = helper.make_graph(nodes, "tokens", ins, out, [emb, typ, zero, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", ["--ref", pytest.param("--cpu", marks=pytest.mark.slow)])
def test_integer_inputs_are_valid_for_their_consumers(tmp_path: Path, target: str) -> None:
    onnx.save(token_model(), tmp_path / "t.onnx")
    proc = cli("run", "t.onnx", target, "-O", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    inputs = next(ln for ln in proc.stdout.splitlines() if ln.startswith("Inputs: "))
    assert "ids: integers in [0, 10) (indices of" in inputs and "axis 0 of size 10" in inputs
    assert "types: integers in [0, 2) (indices of" in inputs
    assert "mask: 0/1 (a mask: converted to bool by" in inputs


def test_out_of_range_index_names_input_node_and_range(tmp_path: Path) -> None:
    onnx.save(token_model(table=1), tmp_path / "t.onnx")  # --fill1: index 1 of a 1-row table
    proc = cli("run", "t.onnx", "--fill1", cwd=tmp_path)
    assert proc.returncode == 1
    assert "input 'ids' holds 1, outside [-1, 1): it is used as indices of" in proc.stderr
    assert "gather (axis 0 of size 1)" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", ["perf", "verify"])
def test_transformers_bert_runs_with_generated_inputs(tmp_path: Path, command: str) -> None:
    """A BERT exported from transformers (tiny config, random weights): perf and verify on cpu
    used to end in `IndexError: index out of range in self` (random ids past the vocabulary)."""
    pytest.importorskip("transformers")
    path = tmp_path / "bert.onnx"
    path.write_bytes(tiny_bert_onnx())
    extra = ["-n", "2"] if command == "perf" else []
    proc = cli(command, "bert.onnx", "--cpu", "--batch", "2", *extra, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Symbolic dimensions: input_ids[0] 'batch' = 2 (--batch/--default-dim-value), " in (
        proc.stderr
    )
    assert "input_ids: integers in [0, 50) (indices of" in proc.stdout
    assert "token_type_ids: integers in [0, 2)" in proc.stdout
    assert "attention_mask: 0/1 (a mask" in proc.stdout
    if command == "verify":
        assert "FAILED" not in proc.stdout


def tiny_bert_onnx() -> bytes:
    """transformers' BertModel (vocab 50, hidden 16, one layer), exported with dynamic batch and
    sequence (so the driver also names the symbolic dimensions it sets)."""
    import io

    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        type_vocab_size=2,
        attn_implementation="eager",
    )
    model = BertModel(config).eval()

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: ANN001, ANN201
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out.last_hidden_state

    ids = torch.zeros((1, 8), dtype=torch.int64)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            Wrapper(),
            (ids, torch.ones_like(ids), ids),
            buf,
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes={name: {0: "batch", 1: "sequence"} for name in names},
            opset_version=17,
            dynamo=False,
        )
    return buf.getvalue()


# --- 7. -O then compile runs the passes once ----------------------------------------------------
@pytest.mark.slow  # a driver process with torch (the API test below is the quick check)
def test_optimize_then_compile_runs_the_passes_once(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    onnx.save(cnn_model(), tmp_path / "m.onnx")
    env_cli = subprocess.run(
        [sys.executable, "-m", "pygraphx", "compile", "m.onnx", "-O", "--cpu", "-o", "m.pgx"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "PGX_TIME_PASSES": "1"},
        timeout=300,
        check=False,
    )
    assert env_cli.returncode == 0, env_cli.stderr
    from pygraphx.passes.pipeline import optimize_passes

    ran = [
        ln.split(":")[1].strip() for ln in env_cli.stderr.splitlines() if ln.startswith("Pass: ")
    ]
    assert ran == [p.name for p in optimize_passes()]  # -O ran the pipeline; compile did not
    assert env_cli.stderr.count("Passes total:") == 1


def test_compile_reruns_the_passes_when_the_program_changed_after_optimize() -> None:
    pytest.importorskip("torch")
    from pygraphx.passes.manager import listen_passes

    seen: list[str] = []
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    for quantize in (False, True):
        prog = pygraphx.parse_onnx_buffer(cnn_model(1).SerializeToString())
        pygraphx.optimize(prog)
        if quantize:
            pygraphx.quantize_fp16(prog)  # changes the program: compile optimises it again
        seen.clear()
        with listen_passes(lambda k, n, name: seen.append(name)):
            prog.compile(pygraphx.get_target("cpu"))
        assert bool(seen) == quantize
        got = np.array(prog.run({"input": x})[0]).astype(np.float64)
        tol = 2e-2 if quantize else 1e-4
        np.testing.assert_allclose(got, reference_cnn(x), rtol=tol, atol=tol)


# --- 9. progress bars on a terminal, quiet when piped --------------------------------------------
def run_on_terminal(*argv: str, cwd: Path) -> tuple[int, str]:
    """Run the driver with stderr on a pseudo-terminal: (status, what the terminal got)."""
    import pty

    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm", "COLUMNS": "120"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pygraphx", *argv],
        stdout=subprocess.DEVNULL,
        stderr=slave,
        cwd=cwd,
        env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other end closed (Linux: EIO)
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=300), b"".join(chunks).decode(errors="replace")


@pytest.mark.slow  # two driver processes with torch, one on a pseudo-terminal
def test_progress_bars_on_a_terminal_and_none_when_piped(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    onnx.save(cnn_model(), tmp_path / "m.onnx")
    argv = ("perf", "m.onnx", "--cpu", "-n", "20")
    status, terminal = run_on_terminal(*argv, cwd=tmp_path)
    assert status == 0, terminal
    assert re.search(r"compile \(cpu\): [a-z_]+ .*\d+/\d+", terminal)  # one step per pass
    assert "runs" in terminal and "20/20" in terminal and "\u2501" in terminal  # the bar
    piped = cli(*argv, cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert "\u2501" not in piped.stderr and "\x1b[" not in piped.stderr
    assert "compile (cpu): " in piped.stderr  # the step's time, one plain line


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_out_of_range_gather_at_run_time_names_node_and_range(target: str) -> None:
    if target == "cpu":
        pytest.importorskip("torch")
    prog = pygraphx.parse_onnx_buffer(token_model(table=2).SerializeToString())
    prog.compile(pygraphx.get_target(target))
    ids = np.full((1, 6), 5, np.int64)
    with pytest.raises(Exception, match="valid indices: -2 to 1") as err:
        prog.run({"ids": np.zeros_like(ids), "types": ids, "mask": np.ones_like(ids)})
    message = str(err.value)
    assert "gather[axis=0]" in message and "valid indices: -2 to 1" in message
    assert "5" in message and "main:@" in message
