"""``--reasoning-parser``: a reply's ``<think>`` block comes back as ``reasoning_content``,
streamed or not, on the real model (a grammar makes it write one), and the tags stay in
``content`` where the parser is off; ``chat_template_kwargs`` are accepted."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from server_helpers import MODEL, LiveServer

from speclane.engine.async_engine import AsyncEngine
from speclane.server.app import create_app

pytestmark = pytest.mark.slow

REASONING, ANSWER = r"[a-z]{2,9}( [a-z]{2,9}){2,5}", r"[A-Z][a-z]{1,9}( [a-z]{1,9}){0,3}\."
THINK_THEN_ANSWER = f"<think>{REASONING}</think>{ANSWER}"
BODY: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Think briefly, then greet me."}],
                        "max_tokens": 90, "temperature": 0, "guided_regex": THINK_THEN_ANSWER}


@pytest.fixture(scope="module")
def thinking(async_engine: AsyncEngine) -> Iterator[LiveServer]:
    server = LiveServer(create_app(async_engine, reasoning_parser="think"))
    yield server
    server.stop()


def streamed(url: str, body: dict[str, Any]) -> tuple[str, str]:
    reasoning = content = ""
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                reasoning += choice["delta"].get("reasoning_content", "")
                content += choice["delta"].get("content", "") or ""
    return reasoning, content


def test_the_think_block_is_reasoning_content_streamed_or_not(thinking: LiveServer, idle_after: AsyncEngine) -> None:
    response = httpx.post(thinking.url + "/v1/chat/completions", json=BODY, timeout=120)
    assert response.status_code == 200
    message = response.json()["choices"][0]["message"]
    assert re.fullmatch(REASONING, message["reasoning_content"]) and re.fullmatch(ANSWER, message["content"])
    assert streamed(thinking.url, BODY) == (message["reasoning_content"], message["content"])


def test_the_openai_sdk_reads_it(thinking: LiveServer, idle_after: AsyncEngine) -> None:
    client = openai.OpenAI(base_url=thinking.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=MODEL, messages=BODY["messages"], max_tokens=BODY["max_tokens"],
                                           temperature=0, extra_body={"guided_regex": THINK_THEN_ANSWER})
    message = reply.choices[0].message
    assert re.fullmatch(REASONING, (message.model_extra or {})["reasoning_content"])
    assert message.content is not None and re.fullmatch(ANSWER, message.content)
    stream = client.chat.completions.create(model=MODEL, messages=BODY["messages"], max_tokens=BODY["max_tokens"],
                                            temperature=0, stream=True, extra_body={"guided_regex": THINK_THEN_ANSWER})
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content", "") for d in deltas) == \
        (message.model_extra or {})["reasoning_content"]


def test_reasoning_tokens_run_to_the_token_that_ends_the_think_block(thinking: LiveServer,
                                                                     idle_after: AsyncEngine) -> None:
    """SmolLM2 writes "</think>" as several tokens: the count is read by decoding the reply."""
    reply = httpx.post(thinking.url + "/v1/chat/completions", json={**BODY, "logprobs": True}, timeout=120).json()
    count = reply["usage"]["completion_tokens_details"]["reasoning_tokens"]
    tokens = [entry["token"] for entry in reply["choices"][0]["logprobs"]["content"]]
    assert "</think>" in "".join(tokens[:count]) and "</think>" not in "".join(tokens[: count - 1])
    assert count < reply["usage"]["completion_tokens"]


def test_without_the_parser_the_tags_stay_in_content(live: LiveServer, idle_after: AsyncEngine) -> None:
    """SmolLM2's template writes no <think>: ``auto`` leaves its replies as they are."""
    message = httpx.post(live.url + "/v1/chat/completions", json=BODY, timeout=120).json()["choices"][0]["message"]
    assert re.fullmatch(THINK_THEN_ANSWER, message["content"]) and "reasoning_content" not in message


def test_chat_template_kwargs_and_earlier_reasoning_are_accepted(thinking: LiveServer, idle_after: AsyncEngine) -> None:
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False},
            "messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello!", "reasoning_content": "a greeting"},
                         {"role": "user", "content": "Bye"}]}
    assert httpx.post(thinking.url + "/v1/chat/completions", json=body, timeout=120).status_code == 200
    bad = httpx.post(thinking.url + "/v1/chat/completions", timeout=120,
                     json={**body, "chat_template_kwargs": {"add_generation_prompt": False}})
    assert bad.status_code == 400 and "set by the server" in bad.json()["error"]["message"]
