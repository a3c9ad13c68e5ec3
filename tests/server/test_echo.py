"""Completions' ``echo`` on a real server: the prompt comes back before the answer, and with
``logprobs`` each prompt token's logprob (the first's null), as lm-evaluation-harness reads
them to score a continuation; streamed, the first chunk carries the prompt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_helpers import MODEL, LiveServer

CONTEXT, RIGHT, WRONG = "The capital of France is", " Paris", " London"


@pytest.fixture(scope="module")
def http(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=120) as client:
        yield client


def complete(http: httpx.Client, **fields: Any) -> dict[str, Any]:
    response = http.post("/v1/completions", json={"model": MODEL, "temperature": 0, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def tokens_of(http: httpx.Client, text: str) -> list[int]:
    return http.post("/tokenize", json={"model": MODEL, "prompt": text}).json()["tokens"]


def test_echo_sends_the_prompt_before_the_answer(http: httpx.Client) -> None:
    plain = complete(http, prompt=CONTEXT, max_tokens=4)["choices"][0]["text"]
    echoed = complete(http, prompt=CONTEXT, max_tokens=4, echo=True)
    assert echoed["choices"][0]["text"] == CONTEXT + plain
    ids = tokens_of(http, CONTEXT)
    assert complete(http, prompt=ids, max_tokens=4, echo=True)["choices"][0]["text"] == CONTEXT + plain


def score(http: httpx.Client, continuation: str) -> tuple[float, bool]:
    """lm-evaluation-harness's loglikelihood request and its reading of the answer."""
    context = tokens_of(http, CONTEXT)
    whole = tokens_of(http, CONTEXT + continuation)
    assert whole[: len(context)] == context
    logprobs = complete(http, prompt=whole, max_tokens=1, logprobs=1, echo=True)["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(whole) + 1 and logprobs["token_logprobs"][0] is None
    assert logprobs["top_logprobs"][0] is None and logprobs["text_offset"][0] == 0
    picked = logprobs["token_logprobs"][len(context):-1]
    tops = logprobs["top_logprobs"][len(context):-1]
    return sum(picked), all(lp >= max(top.values()) - 1e-6 for lp, top in zip(picked, tops, strict=True))


def test_echo_with_logprobs_scores_a_continuation(http: httpx.Client) -> None:
    right, right_greedy = score(http, RIGHT)
    wrong, wrong_greedy = score(http, WRONG)
    assert right > wrong and right_greedy and not wrong_greedy
    assert -20 < wrong < right < 0


def test_streamed_echo_starts_with_the_prompt(http: httpx.Client) -> None:
    texts: list[str] = []
    with http.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": CONTEXT, "max_tokens": 4,
                                                       "temperature": 0, "echo": True, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                texts += [choice["text"] for choice in json.loads(line[6:])["choices"]]
    assert texts[0].startswith(CONTEXT)
    assert "".join(texts) == complete(http, prompt=CONTEXT, max_tokens=4, echo=True)["choices"][0]["text"]


def test_echo_with_logprobs_and_several_choices_is_a_400(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": CONTEXT, "max_tokens": 1, "echo": True,
                                                  "logprobs": 1, "n": 2})
    assert response.status_code == 400 and response.json()["error"]["param"] == "n"


def test_max_tokens_0_with_echo_sends_the_prompt_alone(http: httpx.Client) -> None:
    """Older scoring clients ask for no answer at all: the prompt's text and logprobs."""
    ids = tokens_of(http, CONTEXT + RIGHT)
    alone = complete(http, prompt=ids, max_tokens=0, logprobs=1, echo=True)
    choice = alone["choices"][0]
    assert choice["text"] == CONTEXT + RIGHT and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(ids)
    with_answer = complete(http, prompt=ids, max_tokens=1, logprobs=1, echo=True)["choices"][0]["logprobs"]
    assert choice["logprobs"]["token_logprobs"] == with_answer["token_logprobs"][:-1]
    assert alone["usage"]["completion_tokens"] == 0 and alone["usage"]["total_tokens"] == len(ids)
    with http.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": CONTEXT, "max_tokens": 0,
                                                       "echo": True, "stream": True,
                                                       "stream_options": {"include_usage": True}}) as response:
        lines = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    texts = [choice["text"] for line in lines for choice in line["choices"]]
    reasons = [choice["finish_reason"] for line in lines for choice in line["choices"] if choice["finish_reason"]]
    assert "".join(texts) == CONTEXT and reasons == ["length"] and lines[-1]["usage"]["completion_tokens"] == 0
    two = complete(http, prompt=CONTEXT, max_tokens=0, echo=True, n=2, temperature=1, seed=3)
    assert [c["text"] for c in two["choices"]] == [CONTEXT, CONTEXT] and two["usage"]["completion_tokens"] == 0


def test_max_tokens_0_without_echo_or_with_min_tokens_is_a_400(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": CONTEXT, "max_tokens": 0})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "max_tokens" and "echo" in error["message"]
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": CONTEXT, "max_tokens": 0, "echo": True,
                                                  "min_tokens": 1})
    assert response.status_code == 400 and response.json()["error"]["param"] == "min_tokens"
