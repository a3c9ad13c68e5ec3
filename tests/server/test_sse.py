"""Server-sent events read raw with httpx: framing, chunk order, the usage chunk, [DONE]."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_helpers import MODEL, LiveServer

from speclane.config import StreamPacing
from speclane.engine.async_engine import AsyncEngine
from speclane.engine.stream_mailbox import paced_interval_s

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Write one short sentence about the sea."}]


def read_events(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    """The ``data:`` payloads in order; asserts the SSE framing (``data: ...`` + blank line)."""
    with client.stream("POST", path, json=body) as response:
        raw = b"".join(response.iter_bytes()).decode()
    assert raw.endswith("\n\n"), "every event ends with a blank line"
    events = raw[:-2].split("\n\n")
    for event in events:
        assert event.startswith("data: ") and "\n" not in event, event
    return response, [event[len("data: "):] for event in events]


@pytest.fixture(scope="module")
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=120) as c:
        yield c


def test_chat_stream_order_with_usage(client: httpx.Client, idle_after: AsyncEngine) -> None:
    response, events = read_events(client, "/v1/chat/completions", {
        "model": MODEL, "messages": MESSAGES, "max_tokens": 8, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-"), "one id for the whole stream"
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)

    first, *middle, finish, usage = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert middle, "at least one content chunk"
    for c in middle:
        assert set(c["choices"][0]["delta"]) == {"content"} and c["choices"][0]["finish_reason"] is None
    assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["usage"] is None for c in chunks[:-1]), "with include_usage, earlier chunks carry usage: null"
    assert usage["choices"] == []
    u = usage["usage"]
    assert u["completion_tokens"] <= 8 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert set(u["completion_tokens_details"]) == {"accepted_prediction_tokens", "rejected_prediction_tokens"}
    assert set(u["speculative"]) == {"rounds", "draft_tokens", "accepted_tokens", "grants", "yields",
                                     "preemptions", "wait_ms"}


def test_stream_without_usage_has_no_usage_key(client: httpx.Client, idle_after: AsyncEngine) -> None:
    _, events = read_events(client, "/v1/chat/completions", {
        "model": MODEL, "messages": MESSAGES, "max_tokens": 3, "temperature": 0, "stream": True})
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]"
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_completions_stream(client: httpx.Client, idle_after: AsyncEngine) -> None:
    _, events = read_events(client, "/v1/completions", {
        "model": MODEL, "prompt": "One, two, three,", "max_tokens": 5, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" and c["id"].startswith("cmpl-") for c in chunks)
    *texts, finish, usage = chunks
    assert "".join(c["choices"][0]["text"] for c in texts)
    assert finish["choices"][0]["finish_reason"] in ("stop", "length") and finish["choices"][0]["text"] == ""
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] <= 5


def test_stop_string_ends_the_stream(client: httpx.Client, idle_after: AsyncEngine) -> None:
    _, events = read_events(client, "/v1/completions", {
        "model": MODEL, "prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 20, "temperature": 0, "stream": True,
        "stop": ["9"]})
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert "9" not in text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop", text


def test_error_before_streaming_is_plain_json(client: httpx.Client) -> None:
    """Validation happens before the stream starts: a normal 4xx, not an event stream."""
    response = client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": MESSAGES, "max_tokens": 0, "stream": True})
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["param"] == "max_tokens"


def test_paced_stream_sends_the_same_answer_in_fewer_chunks(client: httpx.Client, idle_after: AsyncEngine) -> None:
    """``--stream-interval-ms``: tokens that come within the interval share a chunk; the
    answer, its usage and the stream's framing are those of an unpaced stream."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 24, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "speculative": False}

    def answer() -> tuple[str, int, int]:
        _, events = read_events(client, "/v1/chat/completions", body)
        chunks = [json.loads(e) for e in events[:-1]]
        content = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
        texts = [text for text in content if text]
        return "".join(texts), len(texts), chunks[-1]["usage"]["completion_tokens"]

    text, chunks, tokens = answer()
    assert tokens > 4 and 2 < chunks <= tokens, "unpaced: a chunk per tick (fewer only while the loop lags)"
    idle_after.stream_pacing = StreamPacing(interval_ms=10_000)  # longer than the answer: the first chunk, then the rest at the end
    try:
        paced_text, paced_chunks, paced_tokens = answer()
    finally:
        idle_after.stream_pacing = StreamPacing()
    assert (paced_text, paced_tokens) == (text, tokens)
    assert paced_chunks == 2, "the first token at once, the rest with the final chunk (never held back)"


def test_with_many_streams_open_each_streams_interval_grows_with_their_number(idle_after: AsyncEngine) -> None:
    """``--stream-pace-streams``: past that many open streams, each one's interval is
    ``--stream-interval-ms`` x streams / that many (the server's chunks a second stay
    bounded); 0 leaves it as it is."""
    import asyncio

    from speclane.request import SamplingParams

    prompt = idle_after.engine.tokenizer.encode("Count from one to a hundred.")

    async def intervals() -> list[float]:
        streams = [await idle_after.generate(prompt, SamplingParams(max_tokens=200, ignore_eos=True), speculative=False)
                   for _ in range(4)]
        try:
            for stream in streams:
                await anext(stream)  # each is open and reading
            seen = [paced_interval_s(idle_after.stream_pacing, idle_after.num_streams)]
            idle_after.stream_pacing = StreamPacing(interval_ms=20)
            return [*seen, paced_interval_s(idle_after.stream_pacing, idle_after.num_streams)]
        finally:
            for stream in streams:
                await stream.aclose()  # left early: each request is aborted

    idle_after.stream_pacing = StreamPacing(interval_ms=20, pace_streams=2)
    try:
        paced, unpaced = asyncio.run(intervals())
    finally:
        idle_after.stream_pacing = StreamPacing()
    assert paced == pytest.approx(0.04), "4 streams open, paced at 2: twice the interval"
    assert unpaced == pytest.approx(0.02)
