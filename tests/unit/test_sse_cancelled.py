"""``sse_events`` when a choice ends cancelled (shutdown, an engine error): the tokens that
came with the end (a paced chunk, or outputs joined while the server wrote the last one)
are sent before the error event, never dropped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from speclane.engine.engine import RequestOutput
from speclane.server.errors import APIError
from speclane.server.streaming import ResponseMeta, sse_events


async def stream(items: list[RequestOutput]) -> AsyncIterator[RequestOutput]:
    for item in items:
        yield item


def test_tokens_joined_with_a_cancelled_end_are_sent_before_the_error() -> None:
    first = RequestOutput("r", "Once", [1], False, None, 5, 1)
    ended = RequestOutput("r", " upon a", [2, 3], True, "abort", 5, 3)

    async def collect() -> list[bytes]:
        return [event async for event in sse_events(
            ResponseMeta.new(chat=True, model="m"), [stream([first, ended])], include_usage=False,
            cancelled_error=lambda out: APIError(503, "the server is shutting down"))]

    raw = asyncio.run(collect())
    assert raw[-1] == b"data: [DONE]\n\n"
    bodies = [json.loads(event.decode()[len("data: "):]) for event in raw[:-1]]
    content = [body["choices"][0]["delta"].get("content") for body in bodies if body.get("choices")]
    assert content == ["", "Once", " upon a"], "the role chunk, then every token's text"
    assert bodies[-1]["error"]["message"] == "the server is shutting down"
    assert all(body["choices"][0]["finish_reason"] is None for body in bodies if body.get("choices")), \
        "a cancelled choice has no finish chunk: the error ends the stream"
