"""The driver's `compile` command: load (+ --fp16/-O), compile for a target, show or save it.

    pygraphx-driver compile --onnx model.onnx -O                 # print the compiled program
    pygraphx-driver compile --model resnet50 -O --binary --output resnet50.pgx
    pygraphx-driver perf --migraphx resnet50.pgx                  # reuse it, no parse, no passes

As `migraphx-driver compile`: without `--output` the compiled program goes to stdout in the text
format of seed 003; `--output FILE` writes that text to FILE instead, and `--binary --output
FILE` writes the saved form (`pygraphx.save`: msgpack, checksummed, never pickle) that
`--migraphx FILE` and `pygraphx.load` read back compiled, ready to run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pygraphx.driver.commands import Steps, add_target_arguments, compile_program
from pygraphx.driver.loader import DriverError, add_loader_arguments, describe_source


def compile_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `compile`: the model, the target, and where the result goes."""
    add_loader_arguments(parser)
    add_target_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument(
        "--output",
        metavar="FILE",
        help="write the compiled program to FILE instead of stdout (text; see --binary)",
    )
    out.add_argument(
        "--binary",
        action="store_true",
        help="with --output: write the saved program (pygraphx.save) that --migraphx loads",
    )


def cmd_compile(args: argparse.Namespace, steps: Steps) -> int:
    """Compile the model and print it, or write it to `--output` (as text or `--binary`)."""
    if args.binary and args.output is None:
        raise DriverError("--binary writes the saved program to a file: add --output FILE")
    print(f"Reading: {describe_source(args)}", flush=True)
    loaded, target = compile_program(args, steps)
    program = loaded.program
    if args.output is None:
        print(program, end="")
        return 0
    path = Path(args.output)
    if args.binary:
        from pygraphx.ir.serialize import save

        with steps("save"):
            save(program, path)
        size = path.stat().st_size
        print(f"Saved: {path} (compiled for {target.name}, {size} bytes; load with --migraphx)")
    else:
        from pygraphx.ir.atomic_write import write_atomic

        write_atomic(path, str(program))
        print(f"Wrote: {path} (compiled program for {target.name}, text)")
    return 0
