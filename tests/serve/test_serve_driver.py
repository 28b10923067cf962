"""`pygraphx-driver serve` as a user runs it: a process serving one ONNX file on free ports,
answering the Triton client, and exiting 0 on SIGTERM; and configuration errors that name the
file and setting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpclient = pytest.importorskip("tritonclient.http")

from pygraphx.driver.main import main  # noqa: E402
from tests.serve.helpers import add_model, bert_inputs, reference_run, tiny_bert  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a process that imports torch and compiles
def test_driver_serves_an_onnx_file_and_stops_on_sigterm(tmp_path: Path) -> None:
    path = add_model(tmp_path, "bert", tiny_bert(), max_batch=2)
    cmd = [sys.executable, "-m", "pygraphx", "serve", "--onnx", str(path), "--cpu"]
    cmd += ["--http-port", "0", "--grpc-port", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("Serving: HTTP"), line + proc.stderr.read()
        port = int(line.split()[2].rstrip(","))
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_ready() and client.is_model_ready("model")
        arrays = bert_inputs(1, seed=5)
        inputs = []
        for name, arr in arrays.items():
            inputs.append(httpclient.InferInput(name, list(arr.shape), "INT64"))
            inputs[-1].set_data_from_numpy(arr)
        got = client.infer("model", inputs).as_numpy("pooler_output")
        np.testing.assert_array_equal(got, reference_run(path, arrays)[1])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logs = [json.loads(x) for x in proc.stderr.read().splitlines() if x.startswith("{")]
    assert any(doc["msg"] == "stopped" for doc in logs)


def test_config_errors_name_the_file_and_setting(tmp_path: Path, capsys) -> None:
    add_model(tmp_path, "bert", tiny_bert(), max_batch=2, batch_size=4)
    assert main(["serve", "--model-repository", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "config.json" in err and "unknown setting(s) ['batch_size']" in err
    assert main(["serve", "--model-repository", str(tmp_path / "missing")]) == 1
    assert "not a directory" in capsys.readouterr().err
