"""A client that goes away aborts its request: its KV slot is freed and, if it held the
speculative lane, the lane passes to the next waiter. Checked inside the engine.

The test engine grants the lane for a whole generation (``spec_grant_rounds=0``), so
the holder can only change because the holder finished or was aborted.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from server_helpers import MODEL, LiveServer, engine_idle, wait_until

from speclane.engine.async_engine import AsyncEngine

pytestmark = pytest.mark.slow

# At temperature 0 the model writes this story past 400 tokens (counting stops at ~120).
LONG = [{"role": "user", "content": "Write a very long story about a dragon."}]
LONG_MAX_TOKENS = 400
# Tokens a request may still get between the hang-up and its abort (a few ticks).
MAX_TOKENS_AFTER_HANGUP = 40


class OpenStream:
    """A streaming chat request on its own connection; ``close()`` hangs up mid-stream."""

    def __init__(self, url: str, tenant: str, max_tokens: int = LONG_MAX_TOKENS) -> None:
        self.client = httpx.Client(base_url=url, timeout=120)
        body = {"model": MODEL, "messages": LONG, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "user": tenant}
        self.response = self.client.send(self.client.build_request("POST", "/v1/chat/completions", json=body),
                                         stream=True)
        assert self.response.status_code == 200
        self.lines: Iterator[str] = self.response.iter_lines()
        self.request_id = json.loads(self.next_data())["id"]

    def next_data(self) -> str:
        for line in self.lines:
            if line.startswith("data: "):
                return line[len("data: "):]
        raise AssertionError("the stream ended early")

    def close(self) -> None:
        self.response.close()
        self.client.close()


def generated(async_engine: AsyncEngine, tenant: str) -> int:
    return async_engine.engine.counters.snapshot()["generated_by_tenant"].get(tenant, 0)


def test_disconnect_frees_kv_and_passes_the_lane(live: LiveServer, async_engine: AsyncEngine) -> None:
    scheduler = async_engine.engine.scheduler
    lane = scheduler.lane
    assert engine_idle(async_engine)
    held_before = scheduler.kv.num_holders

    a = OpenStream(live.url, "disconnect-a")
    wait_until(lambda: lane.holders == (a.request_id,), timeout=60, what="A to hold the lane")
    b = OpenStream(live.url, "disconnect-b")
    wait_until(lambda: b.request_id in lane.waiters, timeout=60, what="B to wait for the lane")
    assert lane.holders == (a.request_id,)
    assert scheduler.kv.num_holders == held_before + 2
    assert a.request_id in scheduler.running, "A must still be generating when it hangs up"

    at_hangup = generated(async_engine, "disconnect-a")
    a.close()
    wait_until(lambda: a.request_id not in scheduler.running, timeout=30, what="A to be aborted")
    assert generated(async_engine, "disconnect-a") - at_hangup < MAX_TOKENS_AFTER_HANGUP
    wait_until(lambda: lane.holders == (b.request_id,), timeout=30, what="the lane to pass to B")
    assert scheduler.kv.num_holders == held_before + 1, "A's KV blocks are released"
    assert a.request_id not in lane
    assert live.tracker.num_live == 1

    # B is unaffected: it keeps streaming after A left.
    assert json.loads(b.next_data())["choices"][0]["delta"].get("content") is not None
    b.close()
    wait_until(lambda: engine_idle(async_engine), timeout=30, what="the KV pool to be full again")
    assert live.tracker.num_live == 0
    assert generated(async_engine, "disconnect-b") < LONG_MAX_TOKENS


def test_disconnect_of_a_non_streaming_request_aborts_it(live: LiveServer, async_engine: AsyncEngine) -> None:
    scheduler = async_engine.engine.scheduler
    body = json.dumps({"model": MODEL, "messages": LONG, "max_tokens": LONG_MAX_TOKENS, "temperature": 0,
                       "user": "disconnect-plain"}).encode()
    sock = socket.create_connection(("127.0.0.1", live.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    wait_until(lambda: generated(async_engine, "disconnect-plain") > 0, timeout=60, what="generation to start")
    assert scheduler.num_running == 1
    at_hangup = generated(async_engine, "disconnect-plain")
    sock.close()
    wait_until(lambda: scheduler.num_running == 0, timeout=30, what="the request to be aborted")
    assert generated(async_engine, "disconnect-plain") - at_hangup < MAX_TOKENS_AFTER_HANGUP
    wait_until(lambda: engine_idle(async_engine), timeout=30, what="its KV slot to be free")
    assert live.tracker.num_live == 0


def test_disconnect_before_the_first_token(live: LiveServer, async_engine: AsyncEngine) -> None:
    """Hanging up right after sending: whatever stage the request reached, nothing leaks."""
    body = json.dumps({"model": MODEL, "messages": LONG, "max_tokens": LONG_MAX_TOKENS, "stream": True}).encode()
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", live.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        sock.close()
    wait_until(lambda: engine_idle(async_engine) and live.tracker.num_live == 0, timeout=60,
               what="every hung-up request to be aborted")
