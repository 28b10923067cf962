"""The driver's subcommands, one function each, and the table `main.py` builds argparse from.

Every command is `fn(args, steps) -> exit status`. Results go to stdout in MIGraphX's formats
(`read` prints the program in MIGraphX's text format, `params` prints `inputs:` / `outputs:` as
`migraphx-driver params` does); progress and step timings go to stderr through `Steps` (rich),
so stdout stays clean for pipes. `compile`, `time`, `perf` and `verify` live in their own modules
(`compile_cmd.py`, `perf.py`, `verify.py` with `compare.py`), which build on the helpers here
(`Steps`, `compile_program`, `make_inputs`); `COMMANDS` imports them when they run.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import onnx
from rich.console import Console
from rich.table import Table

from pygraphx.driver.inputs import (
    check_index_inputs,
    check_input_sizes,
    generate_inputs,
    plan_inputs,
    seed_argument,
)
from pygraphx.driver.loader import (
    DriverError,
    LoadedModel,
    add_loader_arguments,
    describe_source,
    load_program,
    positive_int,
)
from pygraphx.driver.progress import compile_progress
from pygraphx.driver.steps import Steps, format_seconds
from pygraphx.ir.argument import Argument, format_values
from pygraphx.ir.printer import print_program, source_annotation
from pygraphx.ir.program import Program
from pygraphx.ir.serialize import FORMAT_VERSION, MAGIC, SerializationError, load
from pygraphx.ir.shape import Shape
from pygraphx.targets import Target, get_target
from pygraphx.targets.cpu.threads import THREADS_ENV
from pygraphx.targets.gpu import GpuUnavailableError
from pygraphx.version import ONNX_OPSET, __version__

VALUES_SHOWN = 5  # first and last values printed per output, as MIGRAPHX_TRACE_EVAL does


# --- read, params ---------------------------------------------------------------------------
def cmd_read(args: argparse.Namespace, steps: Steps) -> int:
    """Print the parsed program in MIGraphX's text format (`--sources`: each instruction's ONNX
    node(s) after it, as `# 'layer1/conv2' Conv`)."""
    print(f"Reading: {describe_source(args)}", flush=True)
    loaded = load_program(args, steps)
    print(print_program(loaded.program, source_annotation if args.sources else None))
    return 0


def _read_arguments(parser: argparse.ArgumentParser) -> None:
    add_loader_arguments(parser)
    parser.add_argument(
        "--sources",
        action="store_true",
        help="end each instruction's line with the ONNX node(s) it comes from",
    )


def _shape_json(shape: Shape) -> dict[str, object]:
    return {"type": shape.type(), "lens": shape.lens(), "strides": shape.strides()}


def cmd_params(args: argparse.Namespace, steps: Steps) -> int:
    """Print the program's inputs and outputs (name: type, lens, strides)."""
    if not args.json:
        print(f"Reading: {describe_source(args)}", flush=True)
    program = load_program(args, steps).program
    inputs, outputs = program.get_inputs(), program.get_outputs()
    if args.json:
        doc = {
            "source": describe_source(args),
            "inputs": {name: _shape_json(s) for name, s in inputs.items()},
            "outputs": {name: _shape_json(s) for name, s in outputs.items()},
        }
        print(json.dumps(doc, indent=2))
        return 0
    print("inputs:")
    for name, shape in inputs.items():
        print(f"{name}: {shape}")
    print()
    print("outputs:")
    for name, shape in outputs.items():
        print(f"{name}: {shape}")
    return 0


# --- run ------------------------------------------------------------------------------------
def resolve_target(name: str, threads: int | None = None) -> Target:
    """The target called `name` (with `--threads`, cpu only), or a `DriverError` saying it is
    not available."""
    if threads is not None and name != "cpu":
        raise DriverError(f"--threads {threads} applies to the cpu target (--cpu), not {name!r}")
    try:
        return get_target(name, threads=threads) if threads is not None else get_target(name)
    except ValueError as exc:
        raise DriverError(
            f"target {name!r} is not available yet ({exc}); run on the reference target with --ref"
        ) from None
    except GpuUnavailableError as exc:
        raise DriverError(f"--gpu: {exc}") from None


def make_inputs(args: argparse.Namespace, loaded: LoadedModel) -> tuple[dict[str, Argument], str]:
    """The run's inputs and what they are (`--fill0`, `--fill1`, or seeded random, integer
    inputs drawn from the range their consumers accept: see `inputs.py`)."""
    shapes = loaded.program.get_parameter_shapes()
    try:
        check_input_sizes(shapes)
    except ValueError as exc:
        raise DriverError(str(exc)) from None
    if args.fill is not None:
        value = args.fill
        inputs = {n: Argument(np.full(s.lens(), value, s.dtype())) for n, s in shapes.items()}
        described = f"all {value}"
    else:
        inputs, described = _random_inputs(args, loaded, shapes)
    plans = loaded.input_plans if loaded.input_plans is not None else plan_inputs(loaded.program)
    try:
        check_index_inputs(plans, inputs)
    except ValueError as exc:
        raise DriverError(f"{described}: {exc}") from None
    return inputs, described


def _random_inputs(
    args: argparse.Namespace, loaded: LoadedModel, shapes: dict[str, Shape]
) -> tuple[dict[str, Argument], str]:
    valid: dict[str, np.ndarray] = {}
    if loaded.model_name is not None and loaded.model is not None:
        from pygraphx.models import model_inputs

        valid = model_inputs(loaded.model_name, loaded.model, seed=args.seed)
    plans = loaded.input_plans if loaded.input_plans is not None else plan_inputs(loaded.program)
    inputs, notes = generate_inputs(plans, shapes, args.seed)
    for name, shape in shapes.items():
        arr = valid.get(name)
        if arr is not None and list(arr.shape) == shape.lens() and arr.dtype == shape.dtype():
            inputs[name] = Argument(np.asarray(arr, order="C"))
    if valid:
        return inputs, f"valid random inputs for {loaded.model_name} (seed {args.seed})"
    described = f"random (seed {args.seed})"
    return inputs, described + "".join(f"; {note}" for note in notes)


def summarize(name: str, value: Argument) -> list[str]:
    """An output's shape, statistics over its finite values, and its first/last values."""
    arr = np.asarray(value)
    lines = [f"{name}: {value.get_shape()}"]
    if arr.size == 0:
        return [*lines, "  (no elements)"]
    wide = arr.astype(np.float64).reshape(-1)
    finite = np.isfinite(wide)
    nonfinite = int(wide.size - finite.sum())
    if finite.any():
        x = wide[finite]
        lines.append(
            f"  min: {x.min():.6g}, max: {x.max():.6g}, mean: {x.mean():.6g}, std: {x.std():.6g}"
        )
    if nonfinite:
        nan = int(np.isnan(wide).sum())
        lines.append(f"  non-finite: {nan} nan, {nonfinite - nan} inf (of {wide.size} values)")
    lines.append(f"  values: {format_values(arr, VALUES_SHOWN)}")
    return lines


def compile_program(
    args: argparse.Namespace, steps: Steps, loaded: LoadedModel | None = None
) -> tuple[LoadedModel, Target]:
    """Load the model (unless given), then compile it for `--ref/--cpu/--gpu` (default ref).

    A program loaded compiled (`--migraphx`) runs on the target it was compiled for; naming
    another target is an error."""
    threads = getattr(args, "threads", None)
    if loaded is None:
        with _threads_env(threads):  # a saved compiled program is prepared as it loads
            loaded = load_program(args, steps)
    program = loaded.program
    if program.is_compiled():
        compiled = program.target.name
        if args.target is not None and args.target != compiled:
            raise DriverError(
                f"{loaded.source} is already compiled for target {compiled!r}; drop "
                f"--{args.target}, or compile the model for {args.target} from the ONNX file"
            )
        return loaded, program.target
    name = args.target or "ref"
    if name == "auto":
        name = auto_target()
    target = resolve_target(name, threads)
    with compile_progress(steps, f"compile ({target.name})", program):
        program.compile(target, offload_copy=True)
    return loaded, target


def auto_target() -> str:
    """The fastest target this machine has: gpu when torch sees a GPU, cpu with torch, else
    ref (torch is imported only when it is installed)."""
    if importlib.util.find_spec("torch") is None:
        return "ref"
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


@contextmanager
def _threads_env(threads: int | None) -> Iterator[None]:
    """`PGX_CPU_THREADS` set to `threads` (when given) for the duration."""
    before = os.environ.get(THREADS_ENV)
    if threads is not None:
        os.environ[THREADS_ENV] = str(threads)
    try:
        yield
    finally:
        if threads is not None:
            if before is None:
                del os.environ[THREADS_ENV]
            else:
                os.environ[THREADS_ENV] = before


def cmd_run(args: argparse.Namespace, steps: Steps) -> int:
    """Compile the model, run it once on generated inputs, and summarise every output."""
    print(f"Reading: {describe_source(args)}", flush=True)
    loaded, target = compile_program(args, steps)
    program: Program = loaded.program
    inputs, described = make_inputs(args, loaded)
    start = time.perf_counter()
    with steps("run"):
        results = program.run(inputs)
    elapsed = time.perf_counter() - start
    print(f"Target: {target.name}")
    print_threads(target)
    print(f"Inputs: {described}")
    for name, value in zip(program.get_output_names(), results, strict=True):
        print()
        print("\n".join(summarize(name, value)))
    print()
    print(f"Run time: {format_seconds(elapsed)}")
    return 0


def print_threads(target: Target) -> None:
    """`Threads: N` for a target that runs on CPU threads (cpu)."""
    threads = getattr(target, "threads", None)
    if threads is not None:
        print(f"Threads: {threads.n}", flush=True)


# --- onnx, version --------------------------------------------------------------------------
def cmd_onnx(args: argparse.Namespace, steps: Steps) -> int:
    """`onnx --list`: the supported ONNX operators (a table on a terminal, else one per line)."""
    if not args.list:
        raise DriverError("onnx: nothing to do; use --list (-l) to list the supported operators")
    from pygraphx.onnx import get_onnx_operators
    from pygraphx.onnx.registry import supported_operators

    out = Console(highlight=False)
    if not out.is_terminal:
        for name in get_onnx_operators():
            print(name)
        return 0
    ops = supported_operators()
    table = Table(title=f"Supported ONNX operators ({len(ops)})")
    table.add_column("Domain")
    table.add_column("Operator")
    table.add_column("Since opset", justify="right")
    for domain, op_type, since in ops:
        table.add_row(domain, op_type, str(since))
    out.print(table)
    return 0


def cmd_version(args: argparse.Namespace, steps: Steps) -> int:
    """Versions of pygraphx, the ONNX opset it targets, and its main dependencies; with
    `--migraphx FILE`, those of a saved program."""
    path = getattr(args, "migraphx", None)
    if path is not None:
        for line in saved_file_versions(path):
            print(line)
        return 0
    print(f"pygraphx version: {__version__}")
    print(f"ONNX Opset version: {ONNX_OPSET}")
    print(f"Program file format version: {FORMAT_VERSION} (.pgx/.mxr)")
    print(f"onnx version: {onnx.__version__}")
    print(f"numpy version: {np.__version__}")
    return 0


def saved_file_versions(path: str) -> list[str]:
    """What `version --migraphx FILE` prints: the file's format version (and whether this
    pygraphx reads it), the pygraphx that wrote it and the target it was compiled for."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER_SIZE)
    except OSError as exc:
        raise DriverError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(head) < _HEADER_SIZE or not head.startswith(MAGIC):
        raise DriverError(
            f"{path}: not a saved pygraphx program (bad magic number); write one with "
            "`compile --binary --output FILE` or an output named .pgx/.mxr"
        )
    (version,) = struct.unpack_from("<I", head, len(MAGIC))
    lines = [f"File: {path}"]
    if version != FORMAT_VERSION:
        return [
            *lines,
            f"Program file format version: {version} (this pygraphx {__version__} reads "
            f"{FORMAT_VERSION}: not compatible; re-create it from the ONNX model)",
        ]
    try:
        program = load(path)  # checks length, checksum and every instruction
    except SerializationError as exc:
        raise DriverError(str(exc)) from None
    with open(path, "rb") as f:
        doc = msgpack.unpackb(f.read()[_HEADER_SIZE:], raw=False, strict_map_key=False)
    target = program.target.name if program.target is not None else "none (not compiled)"
    return [
        *lines,
        f"Program file format version: {version} (this pygraphx {__version__} reads "
        f"{FORMAT_VERSION}: compatible)",
        f"Written by pygraphx version: {doc.get('pygraphx_version', 'unknown')}",
        f"Compiled for target: {target}",
    ]


#: the saved-program header (ir/serialize.py): magic, format version, length, SHA-256
_HEADER_SIZE = len(MAGIC) + 4 + 8 + 32


# --- the table ------------------------------------------------------------------------------
def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """`--ref` (the default) / `--cpu` / `--gpu` / `--auto`; `args.target` is None when none
    is given."""
    target = parser.add_argument_group("target").add_mutually_exclusive_group()
    for name in ("ref", "cpu", "gpu"):
        default = " (default; a saved compiled program: its own target)" if name == "ref" else ""
        target.add_argument(
            f"--{name}",
            dest="target",
            action="store_const",
            const=name,
            help=f"compile for and run on {name}{default}",
        )
    target.add_argument(
        "--auto",
        dest="target",
        action="store_const",
        const="auto",
        help="gpu when torch sees a GPU, else cpu when torch is installed, else ref",
    )
    parser.add_argument(
        "--enable-offload-copy",
        dest="offload_copy",
        action="store_true",
        help="host inputs and outputs, copied to and from the device (compile's offload_copy; "
        "already what the driver does, since its inputs live on the host: accepted for "
        "migraphx-driver command lines)",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="threads of the cpu target (default: PGX_CPU_THREADS, else the physical cores "
        "this process may use, capped; see the README)",
    )
    parser.set_defaults(target=None)


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """`--fill0` / `--fill1` / `--seed N`: the inputs `make_inputs` generates."""
    data = parser.add_argument_group("inputs").add_mutually_exclusive_group()
    data.add_argument("--fill0", dest="fill", action="store_const", const=0, help="inputs all 0")
    data.add_argument("--fill1", dest="fill", action="store_const", const=1, help="inputs all 1")
    parser.add_argument(
        "--seed", type=seed_argument, default=0, help="seed of the random inputs (0 to 2**63-1)"
    )


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    add_loader_arguments(parser)
    add_target_arguments(parser)
    add_input_arguments(parser)


def _params_arguments(parser: argparse.ArgumentParser) -> None:
    add_loader_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the parameters as JSON")


def _onnx_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-l", "--list", action="store_true", help="list the supported ONNX operators"
    )


def _version_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--migraphx",
        metavar="FILE",
        help="a saved program (.pgx/.mxr): the format version and the pygraphx that wrote it",
    )


@dataclass(frozen=True)
class Command:
    """A subcommand: what it does, its options, its help line."""

    run: Callable[[argparse.Namespace, Steps], int]
    arguments: Callable[[argparse.ArgumentParser], None]
    help: str
    examples: tuple[str, ...] = ()  # command lines shown by --help (after the program name)


def _lazy(module: str, name: str) -> Callable[..., Any]:
    """`module.name`, imported on first call: those modules import this one."""

    def call(*args: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args)

    call.__name__ = name
    return call


_COMPILE, _PERF, _VERIFY = (f"pygraphx.driver.{m}" for m in ("compile_cmd", "perf", "verify"))

COMMANDS: dict[str, Command] = {
    "read": Command(
        cmd_read,
        _read_arguments,
        "print the parsed program",
        (
            "read model.onnx",
            "read --onnx model.onnx -O",
            "read --migraphx model.mxr",
            "read model.onnx --sources   # each line ends with its ONNX node",
        ),
    ),
    "params": Command(
        cmd_params,
        _params_arguments,
        "print the model's inputs and outputs",
        ("params model.onnx", "params --onnx model.onnx --batch 8", "params model.pgx --json"),
    ),
    "compile": Command(
        _lazy(_COMPILE, "cmd_compile"),
        _lazy(_COMPILE, "compile_arguments"),
        "compile the model and print (or --output) the compiled program",
        (
            "compile model.onnx --cpu -o model.pgx        # binary (from the extension)",
            "compile --enable-offload-copy --binary --output ./model.mxr --onnx ./model.onnx",
            "compile model.onnx -O -o model.txt           # the compiled program as text",
        ),
    ),
    "run": Command(
        cmd_run,
        _run_arguments,
        "compile and run the model once on test inputs",
        ("run model.onnx --cpu", "run model.pgx", "run --model bert_base --seq-len 64 --cpu"),
    ),
    "time": Command(
        _lazy(_PERF, "cmd_time"),
        _lazy(_PERF, "time_arguments"),
        "average run time over -n runs",
        ("time model.onnx --cpu -n 50", "time --onnx model.onnx --batch 8 --fp16 --cpu"),
    ),
    "perf": Command(
        _lazy(_PERF, "cmd_perf"),
        _lazy(_PERF, "perf_arguments"),
        "performance report: time of every instruction and of each op kind",
        (
            "perf model.onnx --cpu -n 20",
            "perf --enable-offload-copy --input-dim @input 64 3 224 224 -n 100 --gpu --onnx m.onnx",
            "perf model.pgx --json",
        ),
    ),
    "verify": Command(
        _lazy(_VERIFY, "cmd_verify"),
        _lazy(_VERIFY, "verify_arguments"),
        "compare the compiled (optimised) program with the reference on the same inputs",
        (
            "verify model.onnx --cpu -O",
            "verify --model gpt2 --seq-len 32 --cpu --fp16",
            "verify model.onnx --cpu --int8 --calibration cal.npz --calibration-samples 16",
        ),
    ),
    "onnx": Command(
        cmd_onnx,
        _onnx_arguments,
        "the supported ONNX operators (--list)",
        ("onnx -l", "onnx --list | grep -i conv"),
    ),
    "version": Command(
        cmd_version,
        _version_arguments,
        "print version information (of this pygraphx, or of a saved program with --migraphx)",
        ("version", "version --migraphx ./model.mxr", "--version"),
    ),
    "serve": Command(
        _lazy("pygraphx.driver.serve_cmd", "cmd_serve"),
        _lazy("pygraphx.driver.serve_cmd", "serve_arguments"),
        "serve models on the KServe v2 protocol (HTTP and gRPC), with dynamic batching",
        ("serve --model-repository models/", "serve --onnx model.onnx --cpu --max-batch 8"),
    ),
    "generate": Command(
        _lazy("pygraphx.driver.generate_cmd", "cmd_generate"),
        _lazy("pygraphx.driver.generate_cmd", "generate_arguments"),
        "generate tokens with a decoder that has a KV cache (past/present inputs/outputs)",
        ("generate --model llama_tiny --prompt-ids 1 2 3", "generate --onnx m.onnx --prompt Hi"),
    ),
}
