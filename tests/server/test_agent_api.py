"""Structured outputs, tool calls, ``n`` and logprobs through the ``openai`` package, against
the real server and model: what agent frameworks rely on."""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from server_helpers import MODEL, LiveServer

from speclane.engine.async_engine import AsyncEngine

pytestmark = pytest.mark.slow

ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"], "additionalProperties": False}
WEATHER_SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": ADD_SCHEMA}},
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": WEATHER_SCHEMA}},
]
SCHEMAS = {"add": ADD_SCHEMA, "get_weather": WEATHER_SCHEMA}
ASK_ADD: list[Any] = [{"role": "user", "content": "What is 2 plus 3? Use the add tool."}]


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population_millions: int = Field(ge=0, le=99)


@pytest.fixture(scope="module")
def client(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def assert_valid_calls(message: Any) -> list[Any]:
    calls = message.tool_calls
    assert calls, message
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return calls


# -- structured outputs ------------------------------------------------------------------------


def test_parse_returns_a_validated_object(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    reply = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Describe Paris as JSON."}], response_format=City,
        max_tokens=64, temperature=0)
    parsed = reply.choices[0].message.parsed
    assert isinstance(parsed, City), reply.choices[0].message.content


def test_json_schema_and_json_object_outputs(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    schema_reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "The weather in Rome, as JSON."}], max_tokens=48,
        temperature=0, response_format={"type": "json_schema", "json_schema": {
            "name": "weather", "schema": WEATHER_SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(schema_reply.choices[0].message.content or ""), WEATHER_SCHEMA)
    object_reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give a JSON object with a key 'x'."}], max_tokens=48,
        temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(object_reply.choices[0].message.content or ""), dict)


def test_regex_and_choice_through_extra_body(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    phone = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give a US phone number."}], max_tokens=20,
        temperature=0, extra_body={"structured_outputs": {"regex": r"\(\d{3}\) \d{3}-\d{4}"}})
    import re

    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", phone.choices[0].message.content or "")
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Is the sky green?"}], max_tokens=6, temperature=0,
        extra_body={"guided_choice": ["yes", "no"]})
    assert answer.choices[0].message.content in ("yes", "no")
    completion = client.completions.create(model=MODEL, prompt="The year the Berlin wall fell:", max_tokens=8,
                                           temperature=0, extra_body={"guided_regex": r" \d{4}"})
    assert re.fullmatch(r" \d{4}", completion.choices[0].text)


# -- tool calls --------------------------------------------------------------------------------


def test_required_and_named_tool_choice(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    required = client.chat.completions.create(model=MODEL, messages=ASK_ADD, tools=TOOLS, tool_choice="required",
                                              max_tokens=128, temperature=0)
    choice = required.choices[0]
    assert_valid_calls(choice.message)
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    named = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Is it cold in Oslo?"}], tools=TOOLS, max_tokens=64,
        temperature=1, seed=4, tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False)
    calls = assert_valid_calls(named.choices[0].message)
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert named.choices[0].finish_reason == "tool_calls"


def test_required_calls_written_on_lines_of_their_own_are_all_made(client: openai.OpenAI,
                                                                   idle_after: AsyncEngine) -> None:
    """The model writes a newline after its first call and then the second: both are made (a
    grammar that held calls back to back ended the turn at that newline, with one call)."""
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris and in Tokyo?"}],
        tools=TOOLS[1:], tool_choice="required", max_tokens=160, temperature=0)
    calls = assert_valid_calls(reply.choices[0].message)
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Tokyo"]
    assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content is None


def weather_history(city: str) -> list[Any]:
    """Two earlier turns that called get_weather, so the small model calls it again under "auto"."""
    def called(i: int, name: str, unit: str) -> dict[str, Any]:
        return {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{i}", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": name, "unit": unit})}}]}
    return [{"role": "user", "content": "Weather in Paris?"}, called(1, "Paris", "celsius"),
            {"role": "user", "content": "Weather in Boston?"}, called(2, "Boston", "fahrenheit"),
            {"role": "user", "content": f"Weather in {city}?"}]


def test_strict_tools_hold_auto_calls_to_their_schema(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    cities = ["Tokyo in kelvin", "Oslo in kelvin", "Rome, metric"]

    def calls(strict: bool, city: str, **fields: Any) -> Any:
        tools = [{"type": "function", "function": {**TOOLS[1]["function"], "strict": strict}}]
        reply = client.chat.completions.create(model=MODEL, messages=weather_history(city), tools=tools,
                                               max_tokens=64, temperature=0, **fields)
        return reply if fields.get("stream") else reply.choices[0]

    loose = [calls(False, city).message.tool_calls for city in cities]
    units = [json.loads(c[0].function.arguments).get("unit") for c in loose if c]
    assert set(units) - {"celsius", "fahrenheit"}, units  # the model's own unit: why strict matters here
    for city in cities:
        choice = calls(True, city)
        assert len(assert_valid_calls(choice.message)) == 1 and choice.finish_reason == "tool_calls"
    streamed = "".join(delta.function.arguments or "" for chunk in calls(True, cities[0], stream=True)
                       for choice in chunk.choices for delta in choice.delta.tool_calls or () if delta.function)
    assert streamed == calls(True, cities[0]).message.tool_calls[0].function.arguments
    single = calls(True, cities[1], parallel_tool_calls=False)
    assert len(assert_valid_calls(single.message)) == 1 and single.finish_reason == "tool_calls"
    # the Responses API: its flat tool, history items and function_call output
    items: list[Any] = []
    for message in weather_history(cities[0]):
        if message.get("tool_calls"):
            items += [{"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                       "arguments": c["function"]["arguments"]} for c in message["tool_calls"]]
        else:
            items.append(message)
    response = client.responses.create(model=MODEL, input=items, max_output_tokens=64, temperature=0, tools=[
        {"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": True}])
    called = [item for item in response.output if item.type == "function_call"]
    assert len(called) == 1 and called[0].name == "get_weather"
    jsonschema.validate(json.loads(called[0].arguments), WEATHER_SCHEMA)


def test_streamed_tool_calls_reassemble_to_the_plain_answer(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    fields: dict[str, Any] = dict(model=MODEL, messages=ASK_ADD, tools=TOOLS, tool_choice="required", max_tokens=128,
                                  temperature=0)
    whole = client.chat.completions.create(**fields).choices[0]
    calls: dict[int, dict[str, str]] = {}
    finishes = []
    for chunk in client.chat.completions.create(**fields, stream=True):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                if delta.id:
                    call["id"] = delta.id
                if delta.function and delta.function.name:
                    call["name"] += delta.function.name
                if delta.function and delta.function.arguments:
                    call["arguments"] += delta.function.arguments
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    expected = [{"name": c.function.name, "arguments": c.function.arguments} for c in whole.message.tool_calls or ()]
    assert [{"name": c["name"], "arguments": c["arguments"]} for _, c in sorted(calls.items())] == expected
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert finishes == ["tool_calls"] == [whole.finish_reason]


def test_a_conversation_with_a_tool_result_renders_and_answers(client: openai.OpenAI,
                                                               idle_after: AsyncEngine) -> None:
    history: list[Any] = [
        *ASK_ADD,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    reply = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=16, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.choices[0].message.content or reply.choices[0].message.tool_calls
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=[*ASK_ADD, history[2]], tools=TOOLS, max_tokens=4)
    assert bad.value.param == "messages[1]"


# -- n and logprobs ---------------------------------------------------------------------------


def test_n_choices_equal_single_requests_with_consecutive_seeds(client: openai.OpenAI,
                                                               idle_after: AsyncEngine) -> None:
    fields: dict[str, Any] = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me about the sea."}],
                                  max_tokens=12, temperature=1)
    many = client.chat.completions.create(**fields, n=3, seed=11)
    singles = [client.chat.completions.create(**fields, seed=11 + i) for i in range(3)]
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert [c.message.content for c in many.choices] == [s.choices[0].message.content for s in singles]
    assert many.usage.prompt_tokens == singles[0].usage.prompt_tokens  # type: ignore[union-attr]
    assert many.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)  # type: ignore[union-attr]
    texts: dict[int, str] = {}
    for chunk in client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=1,
                                           seed=3, n=2, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    plain = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=1, seed=3, n=2)
    assert texts == {c.index: c.text for c in plain.choices}


def test_chat_logprobs_are_the_models_own(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=ASK_ADD, max_tokens=6, temperature=0,
                                           logprobs=True, top_logprobs=5)
    items = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert items is not None and len(items) == reply.usage.completion_tokens  # type: ignore[union-attr]
    assert "".join(item.token for item in items) == reply.choices[0].message.content
    for item in items:
        values = [alt.logprob for alt in item.top_logprobs]
        assert len(values) == 5 and values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-5
        assert item.top_logprobs[0].token == item.token  # greedy: the most likely token
        assert bytes(item.bytes or []).decode() == item.token
    # The same positions through a prefill of the prompt plus the output so far.
    first = client.chat.completions.create(model=MODEL, messages=ASK_ADD, max_tokens=1, temperature=0,
                                           logprobs=True, top_logprobs=1)
    assert first.choices[0].logprobs.content[0].logprob == pytest.approx(items[0].logprob, abs=1e-4)  # type: ignore[index,union-attr]


def test_completion_logprobs_shape_and_logit_bias(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    prompt = "The capital of France is"
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0, logprobs=3)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.top_logprobs and logprobs.text_offset
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert len(logprobs.token_logprobs or ()) == len(logprobs.top_logprobs) == len(logprobs.tokens)
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    assert all(len(top) == 3 for top in logprobs.top_logprobs)
    assert client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0,
                                     logprobs=0).choices[0].logprobs.top_logprobs is None  # type: ignore[union-attr]
    # Banning the greedy first token changes the answer.
    tokenizer = idle_after.engine.tokenizer
    first = tokenizer.encode(prompt + reply.choices[0].text)[len(tokenizer.encode(prompt))]
    banned = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                       logit_bias={str(first): -100})
    assert banned.choices[0].text != reply.choices[0].text


def test_leaving_a_stream_of_n_choices_aborts_them_all(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=ASK_ADD, max_tokens=500, temperature=1, n=3,
                                            stream=True)
    for chunk in stream:
        if any(choice.delta.content for choice in chunk.choices):
            break
    stream.close()  # idle_after: every choice's request ends, no KV or stream is left
