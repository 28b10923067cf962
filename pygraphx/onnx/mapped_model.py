"""Reading an ONNX file without copying its weights: initialisers become views of the mapped file.

Decoding a model's protobuf copies every initialiser's `raw_data` into the message, and turning
those bytes into numpy arrays copies them again: a parse held the weights two or three times at
its peak. `read_model_mapped(path)` instead scans the file's protobuf wire format (the file is
memory-mapped, only the headers of the fields on the way are read), and returns the model's
bytes with the `raw_data` of every large main-graph initialiser cut out, the tensor marked as
external data in the model file itself (`location` = the file's name, `offset` and `length` =
where its bytes lie). The parser then reads those tensors through `external_data.py`:
read-only views of the file mapped once, so the weights are the page cache's pages, read when a
pass or a lowering first touches them and dropped from the process when it lets go of them
(`ir/mapped.py`'s `release_mapped`, once the cpu target has packed its copies).

The mapping follows the file: rewriting the model file in place (truncating it) while a program
parsed from it lives is an error on POSIX systems (the program's weights change, or reading them
faults); replacing the file with a new one (write elsewhere, then rename: what `onnx.save` to a
temporary name and most tools do) is safe. `PGX_MAP_WEIGHTS=0` reads the whole file instead.
A model held in memory (`parse_onnx_buffer`) is cut the same way (`split_buffer`): its
initialisers become read-only views of the caller's immutable bytes, not copies.
A file the scanner does not understand (groups, a truncated field) is left whole: the protobuf
decoder then parses it, or reports it, as before.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

#: initialisers whose raw bytes are smaller than this stay in the message (views save nothing)
MIN_MAPPED_BYTES = 1024

# field numbers of onnx.proto: ModelProto.graph, GraphProto.initializer, TensorProto's fields
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_RAW_DATA, _EXTERNAL_DATA, _DATA_LOCATION = 9, 13, 14
_LENGTH_DELIMITED = 2


class _NotScannable(ValueError):
    """The bytes are not protobuf this scanner handles; the file is then read whole."""


def _varint(buf: mmap.mmap | bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _NotScannable("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fields(buf: mmap.mmap | bytes, start: int, end: int):  # noqa: ANN202 (a generator)
    """(field number, wire type, field start, payload start, field end) of each field."""
    pos = start
    while pos < end:
        tag, p = _varint(buf, pos, end)
        wire = tag & 7
        if wire == 0:
            _, q = _varint(buf, p, end)
        elif wire == 1:
            q = p + 8
        elif wire == 5:
            q = p + 4
        elif wire == _LENGTH_DELIMITED:
            n, p = _varint(buf, p, end)
            q = p + n
        else:
            raise _NotScannable(f"wire type {wire}")
        if q > end:
            raise _NotScannable("field past the end of its message")
        yield tag >> 3, wire, pos, p, q
        pos = q


def _delimited(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | _LENGTH_DELIMITED) + _encode_varint(len(payload)) + payload


def _entry(key: str, value: str) -> bytes:
    """A StringStringEntryProto (key = 1, value = 2) as field `external_data`."""
    return _delimited(_EXTERNAL_DATA, _delimited(1, key.encode()) + _delimited(2, value.encode()))


def _strip_tensor(
    buf: mmap.mmap | bytes, start: int, end: int, location: str, spans: set[tuple[int, int]]
) -> bytes | None:
    """The TensorProto at buf[start:end] with its raw_data replaced by a reference to where it
    lies in the file, or None to keep it as it is (small, or not raw bytes held inline)."""
    fields = list(_fields(buf, start, end))
    numbers = [f[0] for f in fields]
    if _EXTERNAL_DATA in numbers or _DATA_LOCATION in numbers or numbers.count(_RAW_DATA) != 1:
        return None
    raw = fields[numbers.index(_RAW_DATA)]
    if raw[1] != _LENGTH_DELIMITED or raw[4] - raw[3] < MIN_MAPPED_BYTES:
        return None
    out = bytearray()
    for number, _, s, _, e in fields:
        if number != _RAW_DATA:
            out += buf[s:e]
    spans.add((raw[3], raw[4] - raw[3]))
    out += _entry("location", location)
    out += _entry("offset", str(raw[3]))
    out += _entry("length", str(raw[4] - raw[3]))
    out += _encode_varint(_DATA_LOCATION << 3) + _encode_varint(1)  # TensorProto.EXTERNAL
    return bytes(out)


def _strip_graph(
    buf: mmap.mmap | bytes, start: int, end: int, location: str, spans: set[tuple[int, int]]
) -> bytes:
    out = bytearray()
    for number, wire, s, p, e in _fields(buf, start, end):
        stripped = None
        if number == _GRAPH_INITIALIZER and wire == _LENGTH_DELIMITED:
            stripped = _strip_tensor(buf, p, e, location, spans)
        out += buf[s:e] if stripped is None else _delimited(number, stripped)
    return bytes(out)


def strip_weights(
    buf: mmap.mmap | bytes, location: str, spans: set[tuple[int, int]] | None = None
) -> bytes:
    """The model in `buf` with its large main-graph initialisers turned into external data
    in the file `location` (see the module docstring); the (offset, length) of each goes into
    `spans`. `_NotScannable` when the bytes are not protobuf this scanner reads."""
    spans = set() if spans is None else spans
    out = bytearray()
    for number, wire, s, p, e in _fields(buf, 0, len(buf)):
        if number == _MODEL_GRAPH and wire == _LENGTH_DELIMITED:
            out += _delimited(number, _strip_graph(buf, p, e, location, spans))
        else:
            out += buf[s:e]
    return bytes(out)


#: the `location` of an initialiser left in the model's bytes held in memory (`split_buffer`)
BUFFER_LOCATION = "pygraphx:model-bytes"


def split_buffer(data: bytes) -> tuple[bytes, set[tuple[int, int]]] | None:
    """For a model held in memory: its bytes with the large initialisers referring to where
    they lie in `data` (location `BUFFER_LOCATION`), and those (offset, length) spans; the
    parser then reads them as read-only views of `data` (immutable bytes) instead of copying
    them out of the decoded message. None: decode `data` as it is (mapping disabled, nothing
    to leave out, or bytes the scanner does not handle)."""
    if not mapping_enabled() or not isinstance(data, bytes):  # views need immutable bytes
        return None
    spans: set[tuple[int, int]] = set()
    try:
        stripped = strip_weights(data, BUFFER_LOCATION, spans)
    except _NotScannable:
        return None
    return (stripped, spans) if spans else None


def mapping_enabled() -> bool:
    """`PGX_MAP_WEIGHTS` (default on): read initialisers as views of the mapped model file."""
    return os.environ.get("PGX_MAP_WEIGHTS", "1").strip().lower() not in ("0", "false", "off")


def read_model_mapped(path: Path) -> bytes | None:
    """The model at `path` with its large initialisers referring to the file itself (see the
    module docstring), or None when the file should be read whole (mapping disabled, an empty
    file, bytes the scanner does not handle, a file that cannot be mapped)."""
    if not mapping_enabled():
        return None
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return strip_weights(buf, path.resolve().name)
    except (OSError, ValueError):  # not mappable, empty, or not protobuf we scan: read it whole
        return None


__all__ = [
    "BUFFER_LOCATION",
    "MIN_MAPPED_BYTES",
    "mapping_enabled",
    "read_model_mapped",
    "split_buffer",
]
