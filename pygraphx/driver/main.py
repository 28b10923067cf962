"""Entry point of `pygraphx-driver` (and `python -m pygraphx`): arguments, dispatch, errors.

    pygraphx-driver params --onnx resnet50.onnx
    pygraphx-driver read --model resnet50 --batch 8
    pygraphx-driver run --onnx model.onnx --input-dim @input 1 3 224 224 --fill1
    pygraphx-driver onnx --list
    pygraphx-driver version

The subcommands come from `commands.COMMANDS`. A failure prints one `error: ...` line (the
exception's message, which may continue on further lines) on stderr and exits with status 1;
`--debug` adds the traceback. Usage errors are argparse's: a message and status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from rich.console import Console

from pygraphx.driver.commands import COMMANDS, Steps, cmd_version
from pygraphx.driver.loader import DriverError, resolve_model_file
from pygraphx.ir.module import ModuleError
from pygraphx.ir.program import ProgramError
from pygraphx.onnx.errors import OnnxParseError
from pygraphx.ops.base import ShapeError
from pygraphx.runtime.evaluator import EvaluationError

PROG = "pygraphx-driver"

#: Errors whose message is meant for the user as it stands; anything else is reported as an
#: internal error (with its type) and a hint to rerun with --debug.
USER_ERRORS: tuple[type[BaseException], ...] = (
    DriverError,
    OnnxParseError,
    ProgramError,
    ModuleError,
    ShapeError,
    EvaluationError,
    OSError,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: global options and one subparser per entry of `COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="pygraphx driver: read, inspect and run ONNX models (after migraphx-driver)",
        epilog=f"examples:\n  {PROG} perf model.onnx --cpu\n  {PROG} compile model.onnx "
        f"-o model.pgx\n  {PROG} run model.pgx\n  {PROG} COMMAND --help   (options, examples)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--version", action="store_true", help="same as the version command")
    # --debug is accepted after the subcommand too; SUPPRESS keeps the global value otherwise
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks of errors"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=command.help,
            description=command.help,
            epilog="examples:\n" + "\n".join(f"  {PROG} {line}" for line in command.examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[common],
        )
        command.arguments(p)
    return parser


def _report(exc: BaseException, debug: bool) -> None:
    if debug:
        traceback.print_exception(exc)
    message = str(exc) or type(exc).__name__
    if not isinstance(exc, USER_ERRORS):
        message = f"internal error: {type(exc).__name__}: {message}"
        if not debug:
            message += " (rerun with --debug for the traceback)"
    print(f"error: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the driver on `argv` (default: the process's arguments); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help and usage errors: report argparse's status
        return exc.code if isinstance(exc.code, int) else 2
    steps = Steps(Console(stderr=True))
    if args.version and args.command is None:
        return cmd_version(args, steps)
    if args.command is None:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: a command is required ({', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    try:
        if hasattr(args, "file"):  # the commands that load a model
            resolve_model_file(args)
    except DriverError as exc:
        print(parser.format_usage(), end="", file=sys.stderr)
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    debug = bool(args.debug)
    try:
        return COMMANDS[args.command].run(args, steps)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `pygraphx-driver read ... | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:  # every failure becomes one clear line (and status 1)
        _report(exc, debug)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
