"""Bad input, against the real server: every case is a 4xx in OpenAI's error shape with a
message that names what to fix; none is a 500, none hangs, none disturbs the engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_helpers import (
    MAX_MODEL_LEN,
    MODEL,
    TEST_ENGINE_OPTIONS,
    LiveServer,
    engine_idle,
    wait_until,
)

from speclane.config import EngineConfig
from speclane.engine.async_engine import AsyncEngine
from speclane.engine.engine import LLMEngine
from speclane.server.app import create_app

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "hi"}]
_ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def _compact(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def chat(**fields: Any) -> bytes:
    return _compact({"model": MODEL, "messages": HI, "max_tokens": 2, **fields})


def completion(**fields: Any) -> bytes:
    return _compact({"model": MODEL, "prompt": "hi", "max_tokens": 2, **fields})


ENDLESS = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
           "$ref": "#/$defs/n"}


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# (name, path, body, expected status, a word the message must contain)
CASES: list[tuple[str, str, bytes, int, str]] = [
    ("malformed JSON", CHAT, b'{"model": "x", "messages": [', 400, "JSON"),
    ("not an object", CHAT, b"[1, 2, 3]", 400, "object"),
    ("empty body", CHAT, b"", 400, "body"),
    ("invalid UTF-8", CHAT, b'{"model": "\xff\xfe"}', 400, "body"),
    ("deeply nested JSON", CHAT, _deep(200_000), 400, "body"),
    ("max_tokens a string", CHAT, chat(max_tokens="5"), 400, "max_tokens"),
    ("temperature a string", CHAT, chat(temperature="hot"), 400, "temperature"),
    ("temperature NaN", CHAT, chat()[:-1] + b', "temperature": NaN}', 400, "temperature"),
    ("top_p Infinity", CHAT, chat()[:-1] + b', "top_p": Infinity}', 400, "top_p"),
    ("stream not a bool", CHAT, chat(stream="yes"), 400, "stream"),
    ("messages a string", CHAT, chat(messages="hello"), 400, "messages"),
    ("unknown top-level field", CHAT, chat(frobnicate=1), 400, "frobnicate"),
    ("unknown message field", CHAT, chat(messages=[{"role": "user", "content": "x", "mood": "happy"}]), 400, "mood"),
    ("empty messages", CHAT, chat(messages=[]), 400, "messages"),
    ("unknown role", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400, "role"),
    ("missing content", CHAT, chat(messages=[{"role": "user"}]), 400, "content"),
    ("content a number", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "content"),
    ("image content part", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]), 400, "'image_url' is not supported"),
    ("empty content parts", CHAT, chat(messages=[{"role": "user", "content": []}]), 400, "at least one part"),
    ("an OpenAI field this server does not read", CHAT, chat(reasoning_effort="low"), 400, "does not read"),
    ("a raw control character", CHAT, b'{"model": "x\x00"}', 400, "control character at character"),
    ("max_tokens and max_completion_tokens differ", CHAT, chat(max_tokens=2, max_completion_tokens=5), 400,
     "one of the two"),
    ("two tool calls with one id", CHAT, chat(messages=[*HI, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}},
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}]), 400, "own id"),
    ("malformed tool parameters, tool_choice auto", CHAT, chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "nonsense"}}}]), 400, "tools[0].function.parameters"),
    # Every JSON value of it nests without end: the parser gives up mid-answer
    ("a schema no finite JSON matches", CHAT, chat(max_tokens=16, response_format={"type": "json_schema",
        "json_schema": {"name": "n", "schema": ENDLESS}}), 400, "grammar"),
    ("missing model", CHAT, json.dumps({"messages": HI}).encode(), 400, "model"),
    ("max_tokens 0", CHAT, chat(max_tokens=0), 400, "max_tokens"),
    ("max_tokens negative", CHAT, chat(max_tokens=-5), 400, "max_tokens"),
    ("max_completion_tokens 0", CHAT, chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    ("max_tokens beyond the context", CHAT, chat(max_tokens=MAX_MODEL_LEN), 400, "at most"),
    ("max_tokens astronomically large", CHAT, chat(max_tokens=10**30), 400, "max_tokens"),
    ("prompt beyond the context", CHAT, chat(messages=[{"role": "user", "content": "word " * 3000}]), 400,
     "shorten"),
    ("n beyond the cap", CHAT, chat(n=9), 400, "at most 8"),
    ("unknown model", CHAT, chat(model="gpt-17"), 404, MODEL),
    ("temperature above 2", CHAT, chat(temperature=3), 400, "temperature"),
    ("top_p zero", CHAT, chat(top_p=0), 400, "top_p"),
    ("negative seed", CHAT, chat(seed=-1), 400, "seed"),
    ("priority beyond int32", CHAT, chat(priority=2**40), 400, "priority"),
    ("priority a float", CHAT, chat(priority=1.5), 400, "priority"),
    ("speculative a string", CHAT, chat(speculative="no"), 400, "speculative"),
    ("17 stop strings", CHAT, chat(stop=["x"] * 17), 400, "stop"),
    ("empty stop string", CHAT, chat(stop=""), 400, "stop"),
    # 4 bytes an item: just under the body limit, so it reaches validation
    ("a million-item stop list", CHAT, chat(stop=["a"] * 1_000_000), 400, "stop"),
    ("a 50 MB body", CHAT, chat(messages=[{"role": "user", "content": "x" * 50_000_000}]), 413, "MiB"),
    ("stream_options without stream", CHAT, chat(stream_options={"include_usage": True}), 400, "stream"),
    ("top_logprobs without logprobs", CHAT, chat(top_logprobs=2), 400, "logprobs"),
    ("top_logprobs beyond 20", CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("logit_bias id outside the vocabulary", CHAT, chat(logit_bias={"99999999": 5}), 400, "vocabulary"),
    ("logit_bias id not a number", CHAT, chat(logit_bias={"hello": 5}), 400, "logit_bias"),
    ("logit_bias beyond 100", CHAT, chat(logit_bias={"5": 101}), 400, "logit_bias"),
    ("frequency_penalty beyond 2", CHAT, chat(frequency_penalty=2.5), 400, "frequency_penalty"),
    ("presence_penalty below -2", CHAT, chat(presence_penalty=-3), 400, "presence_penalty"),
    ("repetition_penalty 0", CHAT, chat(repetition_penalty=0), 400, "repetition_penalty"),
    ("min_p above 1", CHAT, chat(min_p=1.5), 400, "min_p"),
    ("stop_token_ids outside the vocabulary", CHAT, chat(stop_token_ids=[10**8]), 400, "stop_token_ids"),
    ("stop_token_ids negative", CHAT, chat(stop_token_ids=[-1]), 400, "stop_token_ids"),
    ("ignore_eos a string", CHAT, chat(ignore_eos="yes"), 400, "ignore_eos"),
    ("min_tokens negative", CHAT, chat(min_tokens=-1), 400, "min_tokens"),
    ("min_tokens above max_tokens", CHAT, chat(min_tokens=3), 400, "more than the answer may hold"),
    ("min_tokens above max_tokens, completions", COMPLETIONS, completion(min_tokens=3), 400, "min_tokens"),
    ("malformed JSON schema", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}}), 400, "response_format"),
    ("unsupported schema keyword", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "format": "weird"}}}), 400, "format"),
    ("bad regex", CHAT, chat(structured_outputs={"regex": "(a"}), 400, "structured_outputs"),
    ("two constraints", CHAT, chat(response_format={"type": "json_object"}, guided_choice=["a"]), 400,
     "at most one"),
    ("unknown tool in tool_choice", CHAT, chat(tools=[_ADD], tool_choice={"type": "function", "function": {
        "name": "sub"}}), 400, "no tool named"),
    ("duplicate tool names", CHAT, chat(tools=[_ADD, _ADD]), 400, "unique"),
    ("tool message without a matching call", CHAT, chat(messages=[*HI, {"role": "tool", "tool_call_id": "c9",
                                                                       "content": "5"}]), 400, "matches no tool call"),
    ("constraint with tool_choice required", CHAT, chat(tools=[_ADD], tool_choice="required",
                                                         response_format={"type": "json_object"}), 400,
     "cannot be combined"),
    ("malformed tool parameters", CHAT, chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "objekt"}}}], tool_choice="required"), 400, "parameters"),
    ("prediction of the wrong type", CHAT, chat(prediction={"type": "image", "content": "x"}), 400,
     "prediction"),
    ("prediction longer than the context", CHAT, chat(prediction={"type": "content", "content": "word " * 3000}),
     400, "prediction"),
    ("user too long", CHAT, chat(user="u" * 10_000), 400, "user"),
    ("lone surrogate in a message", CHAT, chat(messages=[{"role": "user", "content": "a\ud800"}]), 400, "surrogate"),
    ("lone surrogate as the user", CHAT, chat(user="\udfff"), 400, "surrogate"),
    ("lone surrogate in a prompt", COMPLETIONS, completion(prompt="\ud800b"), 400, "surrogate"),
    ("empty prompt", COMPLETIONS, completion(prompt=""), 400, "prompt"),
    ("empty token list", COMPLETIONS, completion(prompt=[]), 400, "prompt"),
    ("token id outside the vocabulary", COMPLETIONS, completion(prompt=[1, 2, 10**9]), 400, "vocabulary"),
    ("negative token id", COMPLETIONS, completion(prompt=[-1]), 400, "prompt"),
    ("a batch of prompts", COMPLETIONS, completion(prompt=["a", "b"]), 400, "one prompt"),
    ("echo a string", COMPLETIONS, completion(echo="yes"), 400, "echo"),
    ("echo with logprobs, two choices", COMPLETIONS, completion(echo=True, logprobs=1, n=2), 400, "n=1"),
    ("completions n beyond the cap", COMPLETIONS, completion(n=9), 400, "at most 8"),
    ("completions logprobs beyond 5", COMPLETIONS, completion(logprobs=6), 400, "logprobs"),
    ("completions malformed guided_json", COMPLETIONS, completion(guided_json="{not json"), 400, "guided_json"),
    ("completions unknown field", COMPLETIONS, completion(messages=HI), 400, "messages"),
]


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    return error


@pytest.fixture(scope="module")
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=60, headers={"content-type": "application/json"}) as c:
        yield c


@pytest.mark.parametrize(("name", "path", "body", "status", "hint"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_clear_4xx(client: httpx.Client, name: str, path: str, body: bytes, status: int,
                                  hint: str) -> None:
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    error = assert_openai_error(response, status)
    assert hint.lower() in error["message"].lower(), error["message"]
    assert len(error["message"]) < 1000, "the message must not echo the input"


def test_a_surrogate_pair_is_one_character_and_metrics_stay_readable(client: httpx.Client) -> None:
    body = chat(messages=[{"role": "user", "content": "\U0001f600 hi"}], user="t-\U0001f600")
    assert b"\\ud83d\\ude00" in body  # escaped as a pair, as ensure_ascii clients send it
    assert client.post(CHAT, content=body).status_code == 200
    assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_json_without_its_content_type_is_400(live: LiveServer, content_type: str | None) -> None:
    """Not parsed (a browser could send it cross-site without a preflight); the message says why."""
    headers = {"content-type": content_type} if content_type else {}
    response = httpx.post(live.url + CHAT, content=chat(), headers=headers, timeout=60)
    error = assert_openai_error(response, 400)
    assert "Content-Type: application/json" in error["message"]


def test_a_response_format_error_names_its_field_once(client: httpx.Client) -> None:
    response = client.post(CHAT, content=chat(response_format={"type": "json_schema"}))
    assert assert_openai_error(response, 400)["param"] == "response_format.json_schema"
    response = client.post(CHAT, content=chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": 5}}))
    assert assert_openai_error(response, 400)["param"] == "response_format.json_schema.schema"
    # Responses' format is flat: its union's tag is no field of the body
    response = client.post("/v1/responses", json={"model": MODEL, "input": "x", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": 5}}})
    assert assert_openai_error(response, 400)["param"] == "text.format.schema"


def test_a_grammar_the_parser_gives_up_on_ends_the_stream_with_an_error_event(client: httpx.Client) -> None:
    """Mid-answer (the first chunks are out): an error event naming the grammar, then [DONE]."""
    body = chat(max_tokens=16, stream=True, response_format={"type": "json_schema", "json_schema": {
        "name": "n", "schema": ENDLESS}})
    with client.stream("POST", CHAT, content=body) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "grammar_failed" and "grammar" in error["message"], error


def test_the_completions_default_length_shrinks_to_fit_the_context(client: httpx.Client) -> None:
    """No max_tokens sent: the default 16 shrinks to what the context leaves, as vLLM's does;
    one sent is checked as sent."""
    body = {"model": MODEL, "prompt": [9] * (MAX_MODEL_LEN - 4)}
    response = client.post(COMPLETIONS, content=_compact(body))
    assert response.status_code == 200, response.text
    assert 1 <= response.json()["usage"]["completion_tokens"] <= 4
    error = assert_openai_error(client.post(COMPLETIONS, content=_compact({**body, "max_tokens": 16})), 400)
    assert error["param"] == "max_tokens" and "at most 4" in error["message"]


def test_head_is_answered_wherever_get_is(client: httpx.Client) -> None:
    for path in ("/health", "/v1/models", "/version"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code == 200 and head.content == b"", path
        assert head.headers["content-length"] == got.headers["content-length"], path
    assert client.head(CHAT).status_code == 405, "a POST route stays POST"


def test_unknown_route_and_method(client: httpx.Client) -> None:
    assert_openai_error(client.get("/v1/nothing"), 404)
    assert_openai_error(client.get(CHAT), 405)
    assert_openai_error(client.delete("/v1/models"), 405)


def test_oversized_chunked_body_is_413(client: httpx.Client) -> None:
    """No Content-Length: the limit is counted while reading."""

    def chunks():
        for _ in range(50):
            yield b"x" * (1024 * 1024)

    response = client.post(CHAT, content=chunks(), headers={"content-type": "application/json"})
    assert_openai_error(response, 413)


def test_server_still_healthy_after_bad_input(client: httpx.Client, async_engine: AsyncEngine) -> None:
    # The engine serves every test module: a stream another module's test closed may still
    # be aborting. That one is allowed its tick; this request must leave nothing.
    wait_until(lambda: engine_idle(async_engine), timeout=120, what="other tests' requests to end")
    response = client.post(CHAT, content=chat(temperature=0), headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert client.get("/health").status_code == 200
    assert async_engine.error is None
    # The handler's closing abort (a no-op for a finished request) takes the engine's next tick.
    wait_until(lambda: engine_idle(async_engine), timeout=5, what="the engine to be idle after the request")


def test_denormal_temperature_is_greedy(client: httpx.Client) -> None:
    """A temperature of 1e-300 overflows logits / T in the engine; the server treats it as 0."""
    greedy = client.post(CHAT, content=chat(temperature=0, max_tokens=4)).json()
    tiny = client.post(CHAT, content=chat(temperature=1e-300, max_tokens=4)).json()
    assert tiny["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]


def test_a_request_larger_than_the_whole_kv_pool_is_400_not_a_wait(our_kernels) -> None:
    """--kv-cache-mib 1 holds 2 blocks of 16 positions: a completion that can reach past them
    is refused at once with what to change; one that fits is answered."""
    engine = AsyncEngine(LLMEngine(EngineConfig().replace(**TEST_ENGINE_OPTIONS, kv_cache_mib=1)))
    server = LiveServer(create_app(engine))
    try:
        assert engine.engine.kv_pool["blocks"] == 2
        with httpx.Client(base_url=server.url, timeout=60, headers={"content-type": "application/json"}) as c:
            error = assert_openai_error(c.post(COMPLETIONS, content=completion(max_tokens=40)), 400)
            assert "KV pool holds 2" in error["message"] and "--kv-cache-mib" in error["message"], error
            answer = c.post(COMPLETIONS, content=completion(max_tokens=4, temperature=0))
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] >= 1
    finally:
        server.stop()
        engine.shutdown()
