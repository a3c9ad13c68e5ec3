"""``sse_events`` with ``stream_options.continuous_usage_stats`` (vLLM's): every chunk's
usage is the prompt and its own choice's tokens so far; without it, null until the last
chunk; an echo alone (``max_tokens`` 0) counts none."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from speclane.engine.engine import RequestOutput
from speclane.server.errors import APIError
from speclane.server.streaming import Echo, Reading, ResponseMeta, sse_events

PROMPT_TOKENS = 5


def outputs(rid: str, lengths: list[int]) -> list[RequestOutput]:
    """One output per entry, each adding that many tokens (cumulative counts, as the engine's)."""
    done, outs = 0, []
    for i, n in enumerate(lengths):
        done += n
        last = i == len(lengths) - 1
        outs.append(RequestOutput(rid, "x" * n, list(range(n)), last, "length" if last else None, PROMPT_TOKENS, done))
    return outs


async def stream(items: list[RequestOutput]) -> AsyncIterator[RequestOutput]:
    for item in items:
        await asyncio.sleep(0)
        yield item


def events(choices: list[list[RequestOutput]], *, chat: bool = True, continuous: bool = True,
           reading: Reading | None = None) -> list[dict[str, Any]]:
    def cancelled(out: RequestOutput) -> APIError:
        raise AssertionError("nothing is cancelled here")

    async def collect() -> list[bytes]:
        return [event async for event in sse_events(
            ResponseMeta.new(chat=chat, model="m"), [stream(items) for items in choices], include_usage=True,
            cancelled_error=cancelled, reading=reading, continuous_usage=continuous, prompt_tokens=PROMPT_TOKENS)]

    raw = asyncio.run(collect())
    assert raw[-1] == b"data: [DONE]\n\n"
    return [json.loads(event.decode()[len("data: "):]) for event in raw[:-1]]


def test_each_chunk_counts_its_own_choices_tokens_so_far() -> None:
    chunks = events([outputs("a", [1, 2, 1]), outputs("b", [3, 1])])
    seen: dict[int, list[int]] = {0: [], 1: []}
    for body in chunks[:-1]:
        (choice,) = body["choices"]
        usage = body["usage"]
        assert usage["prompt_tokens"] == PROMPT_TOKENS
        assert usage["total_tokens"] == PROMPT_TOKENS + usage["completion_tokens"]
        seen[choice["index"]].append(usage["completion_tokens"])
    # role chunk, then a chunk per output, then the finish chunk
    assert seen[0] == [0, 1, 3, 4, 4] and seen[1] == [0, 3, 4, 4]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8


def test_without_it_usage_is_null_until_the_last_chunk() -> None:
    chunks = events([outputs("a", [1, 2])], continuous=False)
    assert all(body["usage"] is None for body in chunks[:-1]) and chunks[-1]["usage"]["completion_tokens"] == 3


def test_an_echo_alone_counts_no_tokens() -> None:
    reading = Reading(echo=Echo("The prompt", (1, 2, 3), only=True))
    chunks = events([outputs("a", [1])], chat=False, reading=reading)
    assert [body["usage"]["completion_tokens"] for body in chunks] == [0, 0, 0]
    assert "".join(c["text"] for body in chunks for c in body["choices"]) == "The prompt"
