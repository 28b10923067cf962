"""The `pygraphx-driver` command line (after MIGraphX's `migraphx-driver`).

It sits on top of the whole pipeline: `loader.py` turns `--onnx FILE` / `--model NAME` and the
shape options into a `Program` through the ONNX frontend, `commands.py` holds one function per
subcommand (`read`, `params`, `run`, `onnx`, `version`), and `main.py` parses the arguments,
dispatches, and turns errors into one `error: ...` line and exit status 1.
"""

from __future__ import annotations

from pygraphx.driver.main import main

__all__ = ["main"]
