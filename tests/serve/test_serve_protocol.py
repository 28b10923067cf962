"""KServe v2 tensor encodings (pygraphx/serve/protocol.py) against hand-built request bodies:
JSON data, the binary tensor extension, and the errors that name the bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("fastapi")

from pygraphx.serve.protocol import (  # noqa: E402
    InferRequest,
    ProtocolError,
    decode_http,
    encode_http,
)


def _binary_body(doc: dict, *arrays: np.ndarray) -> tuple[bytes, int]:
    header = json.dumps(doc).encode()
    return header + b"".join(a.tobytes() for a in arrays), len(header)


def test_json_and_binary_inputs_decode_to_the_same_arrays() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ids = np.array([[1, 2]], dtype=np.int64)
    doc = {
        "id": "r1",
        "inputs": [
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": x.tolist()},
            {
                "name": "ids",
                "shape": [1, 2],
                "datatype": "INT64",
                "parameters": {"binary_data_size": ids.nbytes},
            },
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }
    body, length = _binary_body(doc, ids)
    req = decode_http(body, length)
    np.testing.assert_array_equal(req.inputs["x"], x)
    assert req.inputs["x"].dtype == np.float32
    np.testing.assert_array_equal(req.inputs["ids"], ids)
    assert req.outputs == ["y"] and req.binary_outputs == {"y": True} and req.id == "r1"


def test_binary_response_round_trips_through_its_header_length() -> None:
    y = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    z = np.array([3, 4], dtype=np.int32)
    req = InferRequest({}, binary_outputs={"y": True})
    body, length = encode_http("m", "1", req, {"y": y, "z": z})
    doc = json.loads(body[:length])
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == y.nbytes
    np.testing.assert_array_equal(np.frombuffer(body[length:], np.float32).reshape(2, 4), y)
    assert doc["outputs"][1]["data"] == [3, 4] and doc["outputs"][1]["datatype"] == "INT32"


@pytest.mark.parametrize(
    ("doc", "binary", "message"),
    [
        ({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1]}]}, b"", "x"),
        (
            {"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
            b"",
            "BYTES",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [2],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 8},
                    }
                ]
            },
            b"\0" * 4,
            "past the body",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [1],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 4},
                    }
                ]
            },
            b"\0" * 8,
            "belong to no input",
        ),
        ({"inputs": "x"}, b"", "'inputs' list"),
    ],
)
def test_malformed_requests_are_refused_by_name(doc: dict, binary: bytes, message: str) -> None:
    header = json.dumps(doc).encode()
    with pytest.raises(ProtocolError, match=message):
        decode_http(header + binary, len(header))


def test_header_length_past_the_body_is_refused() -> None:
    with pytest.raises(ProtocolError, match="Inference-Header-Content-Length"):
        decode_http(b"{}", 10)
