"""The driver's shape options checked against the model's declared inputs, before parsing.

* `--dyn-input-dim @name D...` (each D an integer or `{min,max[,optimal...]}`, or MIGraphX's
  `{min:1,max:8,optimals:[4]}`) and `--default-dyn-dim-value D` become the parse options
  `map_dyn_input_dims` and `default_dyn_dim_value`;
* `symbolic_dims` lists every symbolic (unnamed-size) dimension of the model's inputs with the
  value the options give it, so the driver can say so in one line, and add it to a shape error
  (a model whose batch and sequence silently became 1 fails with a reshape error otherwise);
* `check_ranks` refuses `--input-dim` lens of another rank than the input's ("input 'x' has rank
  3, the model expects 4") before a convolution complains about its strides;
* `batch_ignored` says when `--batch` changes nothing (every input has fixed dimensions).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from pygraphx.driver.errors import DriverError


@dataclass(frozen=True)
class DeclaredInput:
    """A graph input as the ONNX file declares it: dims are ints or symbol names (or '?')."""

    name: str
    dims: tuple[int | str, ...] | None  # None: no shape declared

    def symbolic(self) -> list[tuple[int, str]]:
        return [(k, d) for k, d in enumerate(self.dims or ()) if isinstance(d, str)]


def declared_inputs(model: onnx.ModelProto) -> list[DeclaredInput]:
    """The model's graph inputs that are not initialisers, with their declared dims."""
    initialised = {t.name for t in model.graph.initializer}
    out = []
    for inp in model.graph.input:
        if inp.name in initialised:
            continue
        t = inp.type
        if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            out.append(DeclaredInput(inp.name, None))
            continue
        dims: list[int | str] = []
        for d in t.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or "?")
        out.append(DeclaredInput(inp.name, tuple(dims)))
    return out


# --- --dyn-input-dim ------------------------------------------------------------------------
_KEYED = re.compile(r"(min|max|optimals)\s*:\s*(\[[^\]]*\]|-?\d+)")


def parse_dyn_dim(token: str, flag: str) -> int | dict[str, object]:
    """`8` -> 8; `1:8` or `{1,8}` -> {"min": 1, "max": 8, "optimals": []}; `1:8:4`, `{1,8,4}`
    and `{min:1,max:8,optimals:[4]}` add optimals (the sizes to tune for). Shells expand an
    unquoted `{1,8}` into two words, so the help shows `1:8`."""
    text = token.strip()
    try:
        if not text.startswith("{") and ":" in text:  # 1:8 or 1:8:4 (no shell quoting needed)
            parts = [int(p) for p in text.split(":")]
            if len(parts) < 2:
                raise ValueError("give at least min:max")
            spec = {"min": parts[0], "max": parts[1], "optimals": parts[2:]}
        elif not text.startswith("{"):
            return int(text)
        elif not text.endswith("}"):
            raise ValueError("no closing '}'")
        elif ":" in text[1:-1]:
            body = text[1:-1]
            keyed = {k: v for k, v in _KEYED.findall(body)}
            opts = [int(o) for o in keyed.get("optimals", "[]").strip("[]").split(",") if o.strip()]
            spec = {"min": int(keyed["min"]), "max": int(keyed["max"]), "optimals": opts}
        else:
            parts = [int(p) for p in text[1:-1].split(",") if p.strip()]
            if len(parts) < 2:
                raise ValueError("give at least {min,max}")
            spec = {"min": parts[0], "max": parts[1], "optimals": parts[2:]}
    except (ValueError, KeyError) as exc:
        raise DriverError(
            f"{flag}: cannot read dimension {token!r} ({exc}); write an integer, min:max, "
            "min:max:optimal..., '{min,max}' (quoted: shells expand braces) or "
            "'{min:1,max:8,optimals:[4]}'"
        ) from None
    if not 1 <= spec["min"] <= spec["max"]:
        raise DriverError(f"{flag}: dimension {token!r} needs 1 <= min <= max")
    return spec


def parse_dyn_input_dims(groups: Sequence[Sequence[str]] | None) -> dict[str, list[object]]:
    """`[["@x", "{1,8}", "3"]]` -> `{"x": [{"min": 1, "max": 8, "optimals": []}, 3]}`."""
    dims: dict[str, list[object]] = {}
    name: str | None = None
    for group in groups or []:
        for token in group:
            if token.startswith("@"):
                name = token[1:]
                if not name or name in dims:
                    why = "follow '@' with an input name" if not name else "is given twice"
                    raise DriverError(f"--dyn-input-dim @{name}: {why}")
                dims[name] = []
            elif name is None:
                raise DriverError(
                    f"--dyn-input-dim: expected @NAME before the dimensions, got {token!r} "
                    "(e.g. --dyn-input-dim @input {1,8} 3 224 224)"
                )
            else:
                dims[name].append(parse_dyn_dim(token, f"--dyn-input-dim @{name}"))
    empty = [n for n, d in dims.items() if not d]
    if empty:
        raise DriverError(f"--dyn-input-dim @{empty[0]}: no dimensions given")
    return dims


# --- what the options make of the declared inputs -------------------------------------------
def check_ranks(inputs: Sequence[DeclaredInput], dims: dict[str, list], flag: str) -> None:
    """`flag`'s lens for each input must have the input's declared rank."""
    for inp in inputs:
        given = dims.get(inp.name)
        if given is None or inp.dims is None or len(given) == len(inp.dims):
            continue
        declared = ", ".join(str(d) for d in inp.dims)
        hint = ""
        if flag == "--dyn-input-dim" and len(given) > len(inp.dims):
            hint = " (an unquoted {min,max} is split in two by the shell: write min:max)"
        raise DriverError(
            f"{flag} @{inp.name}: input {inp.name!r} has rank {len(given)}, the model expects "
            f"{len(inp.dims)} ([{declared}]){hint}"
        )


def symbolic_dims(inputs: Sequence[DeclaredInput], options: dict[str, object]) -> list[str]:
    """`x[0] 'N' = 1 (default)` for every symbolic dimension, as `options` set it."""
    fixed = options.get("map_input_dims") or {}
    dyn = options.get("map_dyn_input_dims") or {}
    default_dyn = options.get("default_dyn_dim_value")
    default = options.get("default_dim_value")
    out = []
    for inp in inputs:
        for k, symbol in inp.symbolic():
            if inp.name in fixed:  # a symbolic dimension's value is its maximum
                value, why = f"1..{fixed[inp.name][k]}", "--input-dim: the largest size"
            elif inp.name in dyn:
                value, why = _dyn_text(dyn[inp.name][k]), "--dyn-input-dim"
            elif default_dyn is not None:
                value, why = _dyn_text(default_dyn), "--default-dyn-dim-value"
            elif default is not None:
                value, why = default, "--batch/--default-dim-value"
            else:
                value, why = 1, "default"
            out.append(f"{inp.name}[{k}] {symbol!r} = {value} ({why})")
    return out


def _dyn_text(spec: object) -> str:
    if isinstance(spec, dict):
        opt = f", optimals {spec['optimals']}" if spec.get("optimals") else ""
        return f"{{{spec['min']}..{spec['max']}{opt}}}"
    return str(spec)


def defaulted(lines: Sequence[str]) -> list[str]:
    """The lines of `symbolic_dims` whose value nobody chose (default or --batch)."""
    return [line for line in lines if line.endswith(("(default)", "(--batch/--default-dim-value)"))]


def batch_ignored(inputs: Sequence[DeclaredInput], options: dict[str, object]) -> str | None:
    """A warning when `--batch` is given but no input has a symbolic dimension left for it."""
    if options.get("map_input_dims") or options.get("map_dyn_input_dims") or not inputs:
        return None  # the lens were given explicitly
    if any(i.symbolic() for i in inputs):
        return None
    message = "the model's inputs have no symbolic dimension, so --batch changes no shape"
    example = next((i for i in inputs if i.dims), None)
    if example is None:
        return message
    rest = " ".join(str(d) for d in example.dims[1:])
    return f"{message}; a fixed batch may be changed with --input-dim @{example.name} N {rest}"
