"""SIGTERM on a real ``speclane serve`` process: new requests get 503 at once, a request
that can finish within the grace period finishes, the ones that cannot are aborted with an
error (an event on a stream, a 503 otherwise), and the process exits 0; a second SIGTERM
ends the grace period at once, with the same error events and exit status."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import MODEL, wait_until

pytestmark = pytest.mark.slow

GRACE_S = 4.0
LONG_GRACE_S = 60.0  # a grace the second signal cuts short
LONG_TOKENS = 1900  # several times what a core decodes within the grace period, beside two other streams
STORY = [{"role": "user", "content": "Write a very long story about a dragon."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    yield from serve(tmp_path, GRACE_S)


@pytest.fixture
def served_long_grace(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    yield from serve(tmp_path, LONG_GRACE_S)


def serve(tmp_path: Path, grace_s: float) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "SPECLANE_SHUTDOWN_GRACE_S": str(grace_s)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            # Speculation off: the story degenerates into a loop the n-gram drafter races through
            # (400 tokens in ~1 s on a Zen 5 core), and the long requests must outlast the grace.
            [sys.executable, "-m", "speclane.cli", "serve", "--port", str(port), "--max-model-len", "2048",
             "--num-threads", "1", "--spec-mode", "off"], stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, f"the server exited early:\n{log.read_text()[-3000:]}"
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, timeout=180, interval=0.5, what="speclane serve to come up")
    yield proc, url, log
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class Stream(threading.Thread):
    """A streaming request read to its end in the background; ``events`` are the data payloads."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.events: list[str] = []
        self.started_streaming = threading.Event()

    def run(self) -> None:
        body = {"model": MODEL, "messages": STORY, "max_tokens": self.max_tokens, "temperature": 0, "stream": True}
        with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line[len("data: "):])
                    if len(self.events) >= 2:  # the role chunk and one token: it is generating
                        self.started_streaming.set()


def test_sigterm_drains_then_exits_0(served: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    proc, url, log = served
    long_stream = Stream(url, max_tokens=LONG_TOKENS)
    short_stream = Stream(url, max_tokens=6)
    plain: dict[str, Any] = {}

    def long_plain() -> None:
        response = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": MODEL, "messages": STORY, "max_tokens": LONG_TOKENS, "temperature": 0})
        plain["status"], plain["body"] = response.status_code, response.json()

    plain_thread = threading.Thread(target=long_plain, daemon=True)
    long_stream.start()
    plain_thread.start()
    assert long_stream.started_streaming.wait(60)
    short_stream.start()
    assert short_stream.started_streaming.wait(60)

    proc.send_signal(signal.SIGTERM)
    sigterm_at = time.monotonic()
    time.sleep(0.3)
    refused = httpx.post(url + "/v1/chat/completions", timeout=10,
                         json={"model": MODEL, "messages": STORY, "max_tokens": 1})
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "shutting_down"
    assert httpx.get(url + "/health", timeout=10).status_code == 503

    short_stream.join(30)
    assert short_stream.events[-1] == "[DONE]"
    finish = json.loads(short_stream.events[-2])
    assert finish["choices"][0]["finish_reason"] in ("stop", "length"), "a short request finishes normally"

    long_stream.join(GRACE_S + 30)
    plain_thread.join(GRACE_S + 30)
    assert long_stream.events[-1] == "[DONE]"
    error = json.loads(long_stream.events[-2])
    assert error["error"]["code"] == "shutting_down", error
    assert plain["status"] == 503 and plain["body"]["error"]["code"] == "shutting_down", plain

    assert proc.wait(GRACE_S + 30) == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    assert time.monotonic() - sigterm_at >= GRACE_S - 0.5, "running requests got their grace period"


def test_a_second_sigterm_ends_the_grace_period_at_once(
        served_long_grace: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    proc, url, log = served_long_grace
    long_stream = Stream(url, max_tokens=LONG_TOKENS)
    long_stream.start()
    assert long_stream.started_streaming.wait(60)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert httpx.get(url + "/health", timeout=10).status_code == 503  # draining, the socket still open
    assert long_stream.is_alive(), "the stream outlasts half a second of a 60 s grace"
    proc.send_signal(signal.SIGTERM)
    second_at = time.monotonic()
    long_stream.join(30)
    assert long_stream.events[-1] == "[DONE]"
    assert json.loads(long_stream.events[-2])["error"]["code"] == "shutting_down"
    assert proc.wait(30) == 0, log.read_text()[-3000:]
    assert time.monotonic() - second_at < 15, "the second signal did not wait out the grace period"
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
