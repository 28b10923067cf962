"""Reading a whole input file (an ONNX model, a saved program) with errors a user can act on.

Both the ONNX frontend and `ir.serialize.load` read their file through `read_regular_file`, so a
missing file, a folder, a device or pipe (which could block or never end) and a permission
problem are each reported the same way, naming the path, as the caller's own error type.
"""

from __future__ import annotations

from pathlib import Path


def read_regular_file(path: Path, error: type[Exception], kind: str) -> bytes:
    """The bytes of the regular file at `path`; otherwise `error(message)` naming `path`.
    `kind` names what the file should be ("an ONNX file") for the message about a folder."""
    if path.exists() and not path.is_dir() and not path.is_file():
        raise error(f"{path}: not a regular file (a device or pipe?); refused")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not {kind}") from None
    except PermissionError:
        raise error(f"{path}: permission denied") from None
    except OSError as exc:
        raise error(f"{path}: cannot be read: {exc.strerror or exc}") from None
