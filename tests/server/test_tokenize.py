"""``POST /tokenize``, ``POST /detokenize`` and ``GET /v1/models/{model}`` on a real server:
the token ids are exactly the ones the generation endpoints send the engine (the usage's
prompt_tokens agree), ids come back as text, a model is retrieved with the openai SDK, and
bad input is a 400 or 404 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from server_helpers import MODEL, LiveServer, keyed_server

from speclane.engine.async_engine import AsyncEngine

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


@pytest.fixture(scope="module")
def http(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client


def tokenize(http: httpx.Client, **fields: Any) -> dict[str, Any]:
    response = http.post("/tokenize", json={"model": MODEL, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_chats_tokens_are_the_ones_the_chat_endpoint_counts(http: httpx.Client, async_engine: AsyncEngine) -> None:
    for fields in ({"messages": CHAT}, {"messages": CHAT, "tools": [WEATHER]}):
        counted = tokenize(http, **fields)
        reply = http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1, **fields}).json()
        assert counted["count"] == len(counted["tokens"]) == reply["usage"]["prompt_tokens"]
        assert counted["max_model_len"] == async_engine.engine.max_model_len
    with_tools = tokenize(http, messages=CHAT, tools=[WEATHER])["tokens"]
    plain = tokenize(http, messages=CHAT)["tokens"]
    assert len(with_tools) > len(plain), "the template renders the tools"
    text = http.post("/detokenize", json={"model": MODEL, "tokens": plain}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\n") and "Name a colour." in text
    bare = tokenize(http, messages=CHAT, add_generation_prompt=False)["tokens"]
    assert plain[: len(bare)] == bare and len(bare) < len(plain)


def test_a_prompts_tokens_round_trip(http: httpx.Client, async_engine: AsyncEngine) -> None:
    prompt = "The capital of France is"
    counted = tokenize(http, prompt=prompt, return_token_strs=True)
    assert counted["tokens"] == async_engine.engine.tokenizer.encode_prompt(prompt)
    tokenizer = async_engine.engine.tokenizer
    assert counted["token_strs"] == [tokenizer.id_to_token(i) for i in counted["tokens"]]
    assert counted["token_strs"][-1] == "Ġis", "the vocabulary's entries, as vLLM returns them"
    reply = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}).json()
    assert reply["usage"]["prompt_tokens"] == counted["count"]
    assert http.post("/detokenize", json={"tokens": counted["tokens"]}).json() == {"prompt": prompt}


@pytest.mark.parametrize(("path", "fields", "status", "words"), [
    ("/tokenize", {"model": MODEL}, 400, "either prompt"),
    ("/tokenize", {"model": MODEL, "prompt": "x", "messages": CHAT}, 400, "either prompt"),
    ("/tokenize", {"model": MODEL, "prompt": "x", "tools": [WEATHER]}, 400, "go with messages"),
    ("/tokenize", {"model": MODEL, "prompt": "x", "add_generation_prompt": False}, 400, "go with messages"),
    ("/tokenize", {"model": MODEL, "messages": CHAT, "tools": [WEATHER, WEATHER]}, 400, "unique"),
    ("/tokenize", {"model": MODEL, "messages": CHAT, "chat_template_kwargs": {"messages": []}}, 400,
     "set by the server"),
    ("/tokenize", {"model": "no-such-model", "prompt": "x"}, 404, "does not exist"),
    ("/detokenize", {"model": MODEL, "tokens": [10**8]}, 400, "outside the vocabulary"),
    ("/detokenize", {"model": MODEL, "tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"model": MODEL, "tokens": "12"}, 400, "tokens"),
])
def test_bad_input_is_a_clear_error(http: httpx.Client, path: str, fields: dict[str, Any], status: int,
                                    words: str) -> None:
    response = http.post(path, json=fields)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"], error


def test_a_model_is_retrieved_by_its_id(live: LiveServer) -> None:
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("org/no-such-model")
    assert "does not exist" in missing.value.message


def test_with_api_keys_tokenizing_needs_a_key(async_engine: AsyncEngine, tmp_path: Any) -> None:
    server = keyed_server(async_engine, '[[keys]]\nkey = "sk-a"\ntenant = "a"\n', tmp_path)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert client.post("/tokenize", json={"prompt": "hi"}).status_code == 401
            assert client.get(f"/v1/models/{MODEL}").status_code == 401
            allowed = client.post("/tokenize", json={"prompt": "hi"}, headers={"Authorization": "Bearer sk-a"})
            assert allowed.status_code == 200 and allowed.json()["count"] >= 1
    finally:
        server.stop()
