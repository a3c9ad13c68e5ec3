"""The official ``openai`` package against a real server and the real model: sync and async
clients, streaming and not, ``extra_body`` for ``priority`` / ``speculative``, predictions."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from server_helpers import MODEL, LiveServer

from speclane.engine.async_engine import AsyncEngine

pytestmark = pytest.mark.slow

MESSAGES: list[Any] = [{"role": "user", "content": "Name three colors."}]
SPEC_FIELDS = {"rounds", "draft_tokens", "accepted_tokens", "grants", "yields", "preemptions", "wait_ms"}


@pytest.fixture(scope="module")
def client(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def aclient(live: LiveServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def speculative_usage(usage: Any) -> dict[str, Any]:
    spec = usage.model_extra["speculative"]
    assert set(spec) == SPEC_FIELDS
    return spec


def test_models_list(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_non_streaming(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0)
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage is not None
    assert usage.completion_tokens <= 6 and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.accepted_prediction_tokens is not None
    speculative_usage(usage)


def test_streaming_equals_non_streaming(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert all(c.usage is None for c in chunks[:-1])


def test_continuous_usage_stats_gives_every_chunk_the_counts_so_far(client: openai.OpenAI,
                                                                    idle_after: AsyncEngine) -> None:
    """vLLM's ``stream_options.continuous_usage_stats``: usage on every chunk, never null."""
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))  # type: ignore[typeddict-unknown-key]
    usages = [c.usage for c in chunks]
    assert all(u is not None for u in usages)
    final = usages[-1]
    assert chunks[-1].choices == [] and final is not None and 0 < final.completion_tokens <= 8
    counts = [u.completion_tokens for u in usages if u is not None]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-2] == final.completion_tokens
    assert all(u is not None and u.prompt_tokens == final.prompt_tokens
               and u.total_tokens == u.prompt_tokens + u.completion_tokens for u in usages)


def test_completions_endpoint(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    reply = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert reply.object == "text_completion"
    assert "Paris" in reply.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, stream=True) if c.choices)
    assert streamed == reply.choices[0].text


def test_extra_body_priority_and_speculative(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    off = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0,
                                         extra_body={"priority": -3, "speculative": False})
    spec = speculative_usage(off.usage)
    assert spec["rounds"] == 0 and spec["grants"] == 0, "speculative=false must keep it out of the lane"
    on = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0,
                                        extra_body={"priority": 5, "speculative": True})
    assert speculative_usage(on.usage)["grants"] >= 1, "alone and speculative, it must get the lane"
    assert on.choices[0].message.content == off.choices[0].message.content, "speculation must be lossless"


def test_prediction_is_drafted_from(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0)
    expected = plain.choices[0].message.content
    assert expected
    predicted = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0,
        prediction={"type": "content", "content": expected})
    assert predicted.choices[0].message.content == expected
    details = predicted.usage.completion_tokens_details  # type: ignore[union-attr]
    assert details.accepted_prediction_tokens > 0  # type: ignore[union-attr,operator]


def test_penalties_reach_the_sampler(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    """The SDK's frequency_penalty and presence_penalty, on chat and on completions: a
    repetitive answer changes, speculated or not alike."""
    messages: list[Any] = [{"role": "user", "content": "Copy this line exactly: the cat and the dog and the bird and "
                                                       "the fish and the cow and the horse and the goat."}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0)
    answers = [client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0,
                                              frequency_penalty=1.5, presence_penalty=0.5,
                                              extra_body={"speculative": speculative}).choices[0].message.content
               for speculative in (True, False)]
    assert answers[0] == answers[1] != plain.choices[0].message.content
    prompt = "the cat and the dog and the cat and the dog and the cat and the"
    completions = [client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                             frequency_penalty=penalty).choices[0].text for penalty in (0.0, 2.0)]
    assert completions[0] != completions[1]
    repeated = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                         extra_body={"repetition_penalty": 1.8}).choices[0].text
    assert repeated != completions[0]
    certain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=1.5, seed=4,
                                        extra_body={"min_p": 1.0}).choices[0].text
    assert certain == completions[0], "min_p 1 keeps only the likeliest token: greedy"


def test_stop_token_ids_and_ignore_eos(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    """vLLM's fields through extra_body: a stop token ends the answer on it; ignore_eos runs
    a short answer on to max_tokens."""
    short: list[Any] = [{"role": "user", "content": "Say only: yes"}]
    plain = client.chat.completions.create(model=MODEL, messages=short, max_tokens=40, temperature=0, logprobs=True)
    assert plain.choices[0].finish_reason == "stop" and plain.usage is not None
    first = plain.choices[0].logprobs.content[0].token  # type: ignore[union-attr,index]
    [first_id] = idle_after.engine.tokenizer.encode(first, add_special_tokens=False)
    stopped = client.chat.completions.create(model=MODEL, messages=short, max_tokens=40, temperature=0,
                                             extra_body={"stop_token_ids": [first_id]})
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage is not None
    assert stopped.usage.completion_tokens == 1 and stopped.choices[0].message.content == first
    longer = client.chat.completions.create(model=MODEL, messages=short, temperature=0,
                                            max_tokens=plain.usage.completion_tokens + 8, extra_body={"ignore_eos": True})
    assert longer.choices[0].finish_reason == "length" and longer.usage is not None
    assert longer.usage.completion_tokens == plain.usage.completion_tokens + 8


def test_min_tokens(client: openai.OpenAI) -> None:
    """vLLM's min_tokens through extra_body: a short answer goes on past its end; more than
    max_tokens is a 400 naming the field."""
    short: list[Any] = [{"role": "user", "content": "Say only: yes"}]
    plain = client.chat.completions.create(model=MODEL, messages=short, max_tokens=40, temperature=0)
    assert plain.choices[0].finish_reason == "stop" and plain.usage is not None and plain.choices[0].message.content
    minimum = plain.usage.completion_tokens + 6
    longer = client.chat.completions.create(model=MODEL, messages=short, max_tokens=minimum + 10, temperature=0,
                                            extra_body={"min_tokens": minimum})
    assert longer.usage is not None and longer.usage.completion_tokens >= minimum
    assert (longer.choices[0].message.content or "").startswith(plain.choices[0].message.content)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=short, max_tokens=4, extra_body={"min_tokens": 5})
    assert bad.value.param == "min_tokens"


def test_errors_map_to_openai_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, n=9)
    assert "at most 8" in bad.value.message and bad.value.param == "n"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=100_000)
    assert too_long.value.code == "context_length_exceeded"


def test_async_client_concurrently(aclient: openai.AsyncOpenAI, idle_after: AsyncEngine) -> None:
    async def one(i: int) -> str:
        reply = await aclient.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Say the number {i}."}], max_tokens=5,
            temperature=0, extra_body={"priority": i % 2})
        return reply.choices[0].message.content or ""

    async def streamed() -> str:
        stream = await aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5,
                                                       temperature=0, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def main() -> list[str]:
        try:
            return await asyncio.gather(*(one(i) for i in range(3)), streamed())
        finally:
            await aclient.close()

    texts = asyncio.run(main())
    assert all(texts), texts
