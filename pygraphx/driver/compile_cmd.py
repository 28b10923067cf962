"""The driver's `compile` command: load (+ --fp16/-O), compile for a target, show or save it.

    pygraphx-driver compile --onnx model.onnx -O                 # print the compiled program
    pygraphx-driver compile --model resnet50 -O --binary --output resnet50.pgx
    pygraphx-driver perf --migraphx resnet50.pgx                  # reuse it, no parse, no passes

As `migraphx-driver compile`: without `--output` the compiled program goes to stdout in
MIGraphX's text format. `--output FILE` (`-o`) picks the format from FILE's extension: `.pgx`
and `.mxr` get the saved form (`pygraphx.save`: msgpack, checksummed, never pickle) that
`run FILE`, `--migraphx FILE` and `pygraphx.load` read back compiled, ready to run; `.txt` gets
the text, `.json` the text as JSON (lines per module); any other name gets the text, or the
saved form with `--binary`. The line printed says which was written.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pygraphx.driver.commands import Steps, add_target_arguments, compile_program
from pygraphx.driver.loader import DriverError, add_loader_arguments, describe_source

#: output file extension -> format written (`--binary` asks for "binary" with any other name)
FORMATS = {".pgx": "binary", ".mxr": "binary", ".txt": "text", ".json": "json"}


def compile_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `compile`: the model, the target, and where the result goes."""
    add_loader_arguments(parser)
    add_target_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the compiled program to FILE instead of stdout; the format comes from the "
        "extension: .pgx/.mxr the saved program (loadable), .txt its text, .json the text as "
        "JSON lines per module; other names: text, or the saved program with --binary",
    )
    out.add_argument(
        "--binary",
        action="store_true",
        help="with --output: write the saved program (pygraphx.save) that --migraphx loads",
    )


def output_format(path: Path, binary: bool) -> str:
    """ "binary", "text" or "json" for `--output path` (and `--binary`)."""
    by_name = FORMATS.get(path.suffix.lower())
    if binary and by_name not in (None, "binary"):
        raise DriverError(
            f"--binary writes a saved program, but {path.name} is named as {by_name}; name it "
            ".pgx or .mxr, or drop --binary"
        )
    return "binary" if binary else by_name or "text"


def cmd_compile(args: argparse.Namespace, steps: Steps) -> int:
    """Compile the model and print it, or write it to `--output` (format from its extension)."""
    if args.binary and args.output is None:
        raise DriverError("--binary writes the saved program to a file: add --output FILE")
    path = Path(args.output) if args.output is not None else None
    kind = output_format(path, args.binary) if path is not None else "text"
    print(f"Reading: {describe_source(args)}", flush=True)
    loaded, target = compile_program(args, steps)
    program = loaded.program
    if path is None:
        print(program, end="")
        return 0
    if kind == "binary":
        from pygraphx.ir.serialize import save

        with steps("save"):
            save(program, path)
        size = path.stat().st_size
        print(
            f"Wrote: {path} (saved program compiled for {target.name}, binary, {size} bytes; "
            f"run it with `pygraphx-driver run {path}` or load it with pygraphx.load)"
        )
        return 0
    text = str(program)
    if kind == "json":
        modules: dict[str, list[str]] = {}
        current = "main"
        for line in text.splitlines():
            if line.startswith("module: "):
                current = line[len("module: ") :].strip('"')
                modules[current] = []
            elif line:
                modules.setdefault(current, []).append(line)
        text = json.dumps({"target": target.name, "modules": modules}, indent=1) + "\n"
    from pygraphx.ir.atomic_write import write_atomic

    write_atomic(path, text)
    print(
        f"Wrote: {path} (compiled program for {target.name}, {kind}: for reading; it cannot be "
        "loaded back: write .pgx/.mxr or use --binary for that)"
    )
    return 0
