"""What the fuzz harnesses call, and which exceptions count as a clean refusal.

A harness feeds untrusted bytes to one entry point; the entry point must either succeed or raise
one of the project's documented errors (each with a message naming the problem). Any other
exception (a raw `IndexError`, `RecursionError`, `MemoryError`, ...) is a finding. Shared by the
atheris harnesses (`fuzz/onnx_parser.py`, `fuzz/pgx_load.py`) and the hypothesis tests in
`tests/fuzz/`.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import struct
from collections.abc import Callable

import onnx
from google.protobuf.message import DecodeError

import pygraphx
from pygraphx.ir.module import ModuleError
from pygraphx.ir.serialize import MAGIC, SerializationError
from pygraphx.onnx.errors import OnnxParseError
from pygraphx.ops.base import ShapeError

#: errors the ONNX frontend may raise for a bad model
PARSE_ERRORS = (OnnxParseError,)
#: errors `loads` may raise for a bad file
LOAD_ERRORS = (SerializationError,)
#: errors `compile` may raise for a program that parsed (the ref target validates the IR)
COMPILE_ERRORS = (pygraphx.ProgramError, ModuleError, ShapeError)

#: a model whose program has more elements than this is not compiled by the harness
MAX_COMPILE_ELEMENTS = 1 << 22
_HEADER = struct.Struct("<8sIQ32s")


def parse_onnx_bytes(data: bytes) -> None:
    """Parse `data` as an ONNX model and, if it parses, compile it for `ref`."""
    try:
        prog = pygraphx.parse_onnx_buffer(data)
    except PARSE_ERRORS:
        return
    if sum(s.elements() for s in prog.get_parameter_shapes().values()) > MAX_COMPILE_ELEMENTS:
        return
    try:
        prog.compile(pygraphx.get_target("ref"))
    except COMPILE_ERRORS:
        return


def load_pgx_bytes(data: bytes) -> None:
    """Load `data` as a saved program (`pygraphx.loads`)."""
    from pygraphx.ir.serialize import loads

    try:
        loads(data, "<fuzz>")
    except LOAD_ERRORS:
        return


def reseal(data: bytes) -> bytes:
    """`data` with its header's length and SHA-256 recomputed, so a mutated payload gets past
    the checksum and reaches the decoder (what a deliberate attacker would do)."""
    payload = data[_HEADER.size :] if len(data) >= _HEADER.size else data
    digest = hashlib.sha256(payload).digest()
    return _HEADER.pack(MAGIC, 1, len(payload), digest) + payload


def mixed_mutator(
    structured: Callable[[bytes, random.Random], bytes | None],
    byte_mutator: Callable[[bytes, int], bytes],
) -> Callable[[bytes, int, int], bytes]:
    """A libFuzzer custom mutator: half of the time `structured(data, rng)` (when it gives
    bytes that fit), otherwise `byte_mutator(data, max_size)` (a call of `atheris.Mutate`,
    looked up when it runs: atheris binds it only once `Fuzz()` has started)."""

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if rng.random() < 0.5:
            mutated = structured(data, rng)
            if mutated is not None and len(mutated) <= max_size:
                return mutated
        return byte_mutator(data, max_size)

    return custom_mutator


# --- structure-aware mutation of ONNX models ---------------------------------------------------
_INTS = [0, -1, -4, 1, 2, 3, 7, 1 << 31, -(1 << 31), (1 << 63) - 1, 100000, 10**12]
_OPS = ["Add", "Reshape", "Gather", "Softmax", "Concat", "Expand", "Loop", "If", "Conv", "Relu"]


def mutate_model(data: bytes, rng: random.Random) -> bytes | None:
    """One structural mutation of a valid model (None when `data` does not decode)."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError:
        return None
    try:
        return _mutate(model, rng)
    except (UnicodeDecodeError, TypeError, ValueError):
        return None  # the input holds undecodable text: the byte mutator takes over


def _mutate(model: onnx.ModelProto, rng: random.Random) -> bytes:
    graph = model.graph
    choice = rng.randrange(8)
    nodes = list(graph.node)
    if choice == 0 and nodes:  # two nodes writing one name, or a reference to nothing
        node = rng.choice(nodes)
        if node.output:
            node.output[0] = rng.choice([n.output[0] for n in nodes if n.output] + ["nowhere"])
    elif choice == 1 and nodes:  # an attribute of the wrong type or value
        node = rng.choice(nodes)
        if node.attribute:
            attr = rng.choice(list(node.attribute))
            if rng.random() < 0.5:
                attr.type = rng.choice([1, 2, 3, 6, 7])
            attr.i = rng.choice(_INTS)
            attr.f = rng.choice([float("nan"), float("inf"), -1.5, 0.0])
            attr.ints.append(rng.choice(_INTS))
        else:
            node.attribute.append(onnx.helper.make_attribute("axis", rng.choice(_INTS)))
    elif choice == 2:  # a dim of an input or initialiser: negative, zero or huge
        dims = [d for i in graph.input for d in i.type.tensor_type.shape.dim]
        if dims and rng.random() < 0.5:
            rng.choice(dims).dim_value = rng.choice(_INTS)
        elif graph.initializer:
            init = rng.choice(list(graph.initializer))
            if init.dims:
                init.dims[rng.randrange(len(init.dims))] = rng.choice(_INTS)
    elif choice == 3 and nodes:  # another operator on the same inputs
        rng.choice(nodes).op_type = rng.choice(_OPS)
    elif choice == 4 and nodes:  # a node removed (dangling references)
        del graph.node[rng.randrange(len(nodes))]
    elif choice == 5 and graph.initializer:  # external data with a strange location
        init = rng.choice(list(graph.initializer))
        init.data_location = onnx.TensorProto.EXTERNAL
        location = rng.choice(["a\x00b", "../x.bin", "/etc/passwd", "w.bin", ""])
        init.external_data.add(key="location", value=location)
    elif choice == 6:
        for op in model.opset_import:
            op.version = rng.choice([1, 6, 13, 17, 21, 99, -1])
    elif choice == 7 and graph.initializer:  # a tensor whose bytes do not match its dims
        init = rng.choice(list(graph.initializer))
        init.raw_data = init.raw_data[: rng.randrange(len(init.raw_data) + 1)]
    return model.SerializeToString()


# --- the driver's command line -------------------------------------------------------------
#: commands the driver harness runs: cheap, and none writes a file or starts a server
DRIVER_COMMANDS = ("read", "params", "run", "onnx", "version")
#: argv tokens starting with this name a file in the harness's workspace (`driver_workspace`)
WORKSPACE_PREFIX = "WS:"
#: the most input bytes the driver may generate under the harness (instead of the machine's RAM)
DRIVER_INPUT_BUDGET = 64 << 20
_workspace: list[str] = []


def driver_workspace() -> str:
    """A temporary folder holding `mlp.onnx` (fuzz/make_corpus.py's MLP) and its saved forms
    `mlp.pgx` and `mlp_ref.pgx` (compiled for ref), made once per process."""
    if not _workspace:
        import tempfile
        from pathlib import Path

        from fuzz.make_corpus import seeds

        folder = Path(tempfile.mkdtemp(prefix="pgx-fuzz-driver-"))
        data = seeds()["mlp"].SerializeToString()
        (folder / "mlp.onnx").write_bytes(data)
        pygraphx.save(pygraphx.parse_onnx_buffer(data), folder / "mlp.pgx")
        compiled = pygraphx.parse_onnx_buffer(data)
        compiled.compile(pygraphx.get_target("ref"))
        pygraphx.save(compiled, folder / "mlp_ref.pgx")
        _workspace.append(str(folder))
    return _workspace[0]


def driver_argv(data: bytes) -> list[str]:
    """`data` as an argv list: NUL-separated tokens (undecodable bytes kept as the OS would,
    `surrogateescape`); tokens starting `WS:` name files in the workspace."""
    folder = driver_workspace()
    tokens = data.split(b"\0")[:64]
    argv = [t.decode("utf-8", "surrogateescape") for t in tokens]
    return [
        folder + "/" + a[len(WORKSPACE_PREFIX) :] if a.startswith(WORKSPACE_PREFIX) else a
        for a in argv
    ]


#: values the argv mutator puts after an option or in place of a token
_ARG_VALUES = ["-1", "0", "1", "2", "8", "100000", str(2**63), str(2**64), "nan", "1e3", "",
               "@x", "@", "@y", "x", "1:4", "4:1", "{1,8}", "{1,8,4}", "1:", "float",
               "WS:mlp.onnx", "WS:mlp.pgx", "WS:mlp_ref.pgx", "WS:", "/dev/zero",
               "WS:nothing.onnx", "-", "--"]  # fmt: skip
_driver_words: list[str] = []


def _driver_vocabulary() -> list[str]:
    """Every command name and option string of the driver's parser (read once)."""
    if not _driver_words:
        from pygraphx.driver.commands import COMMANDS
        from pygraphx.driver.main import build_parser

        words = set(COMMANDS)
        top = build_parser()
        parsers = [top]
        for action in top._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers += list(action.choices.values())
        for parser in parsers:
            for action in parser._actions:
                words.update(action.option_strings)
        _driver_words.extend(sorted(words))
    return _driver_words


def mutate_argv(data: bytes, rng: random.Random) -> bytes:
    """One token-level mutation of an argv input (`driver_argv`'s format): insert an option of
    the driver's parser or a command, insert, replace or delete a token, or give a value from
    `_ARG_VALUES`; the byte mutator does the rest."""
    argv = data.split(b"\0")
    words = _driver_vocabulary()
    k = rng.randrange(len(argv) + 1)
    choice = rng.randrange(5)
    if choice == 0:  # an option (and a value) inserted
        new = [rng.choice(words).encode()]
        if rng.random() < 0.6:
            new.append(rng.choice(_ARG_VALUES).encode())
        argv[k:k] = new
    elif choice == 1 and argv:  # a token replaced by a value
        argv[min(k, len(argv) - 1)] = rng.choice(_ARG_VALUES).encode()
    elif choice == 2 and len(argv) > 1:  # a token deleted
        del argv[min(k, len(argv) - 1)]
    elif choice == 3:  # a value inserted
        argv.insert(k, rng.choice(_ARG_VALUES).encode())
    else:  # another command first
        argv[0:1] = [rng.choice(words).encode()]
    return b"\0".join(argv)


class DriverFinding(AssertionError):
    """The driver reported an internal error (a non-project exception) for an argv."""


def run_driver_argv(data: bytes) -> None:
    """Run the driver's `main` on `data` as argv (`driver_argv`), output captured. Argument
    errors, project errors and success are fine; an `internal error` line, an exception out
    of `main` or a status that is no int is a finding. Commands outside `DRIVER_COMMANDS` and
    `--model` (building a built-in model takes seconds) are parsed but not run."""
    import argparse
    import contextlib
    import io

    from pygraphx.driver import inputs
    from pygraphx.driver.main import build_parser, main

    argv = driver_argv(data)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:  # argparse's usage error or --help: its message went to stderr
            return
        except argparse.ArgumentError as exc:  # exit_on_error is on: this would be a bug
            raise DriverFinding(f"argparse raised for {argv!r}: {exc}") from exc
        if args.command not in DRIVER_COMMANDS or getattr(args, "model", None) is not None:
            return
        budget = inputs.physical_memory
        inputs.physical_memory = lambda: DRIVER_INPUT_BUDGET
        try:
            status = main(argv)
        finally:
            inputs.physical_memory = budget
    if not isinstance(status, int) or "internal error" in err.getvalue():
        raise DriverFinding(f"argv {argv!r}: status {status!r}\n{err.getvalue()[-2000:]}")
