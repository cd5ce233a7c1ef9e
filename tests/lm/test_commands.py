"""``iron chat``, ``iron serve`` and ``iron tune`` as a user types them: the installed console
script in a child process, its standard streams, its exit code."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # child processes that load a bundle or tune

IRON = Path(sys.executable).with_name("iron")  # the console script pip installed beside python


def iron(*args, **kwargs) -> subprocess.CompletedProcess:
    assert IRON.is_file(), f"{IRON}: the iron console script is not installed (pip install -e .)"
    return subprocess.run([str(IRON), *map(str, args)], capture_output=True, text=True,
                          timeout=kwargs.pop("timeout", 300), **kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_iron_chat_answers_each_typed_line_and_ends_at_an_empty_one(smollm2_bundle):
    done = iron("chat", smollm2_bundle, "--temp", "0", "-n", "12",
                input="Tell me about Paris.\nAnd about Rome?\n\n")
    assert done.returncode == 0, done.stderr
    answers = [line for line in done.stdout.split("\n") if line.strip()]
    assert len(answers) >= 2, done.stdout  # one reply per typed line, each ended by a newline
    assert "2 turns, " in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_iron_serve_answers_an_openai_request_then_stops_on_sigint(smollm2_bundle):
    port = free_port()
    server = subprocess.Popen([str(IRON), "serve", str(smollm2_bundle), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.communicate()[1]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "iron serve did not answer within 120 s"
                time.sleep(0.5)
        body = json.dumps({"prompt": "The capital of France is", "max_tokens": 4,
                           "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            answer = json.loads(reply.read())
        assert "Paris" in answer["choices"][0]["text"], answer
        assert answer["usage"]["completion_tokens"] == 4
    finally:
        server.send_signal(2)  # Ctrl-C
        _, err = server.communicate(timeout=60)
    assert server.returncode == 130 and err.rstrip().endswith("interrupted"), err  # Ctrl-C's
    assert "Traceback" not in err, err


def test_iron_tune_writes_the_profile_it_reports(project, smollm2):
    """On npu2 the tuner ranks by the cost model (no timing), so it runs anywhere in seconds;
    with --out it writes there and leaves the committed profile alone."""
    out = project / "build" / "tuned-npu2.json"
    committed = (project / "profiles/llama/npu2.json").read_bytes()
    env = {**os.environ, "PYTHONPATH": str(project)}
    done = iron("tune", "--device", "npu2", "--only", "SwiGLU,RMSNorm", "--out", out,
                "--checkpoint", smollm2,
                cwd=project, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    entries = json.loads(out.read_text())["entries"]
    assert entries and {e["operator"] for e in entries} <= {"SwiGLU", "RMSNorm"} | {
        e["operator"] for e in json.loads(committed)["entries"]}
    assert (project / "profiles/llama/npu2.json").read_bytes() == committed
