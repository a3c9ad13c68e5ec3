"""Request validation without a model: what is accepted, and the one-line 400 messages."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from speclane.server.errors import validation_message
from speclane.server.protocol import ChatCompletionRequest, CompletionRequest

HI = [{"role": "user", "content": "hi"}]
_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def chat_error(**fields: Any) -> tuple[str, str | None]:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate({"model": "m", "messages": HI, **fields})
    return validation_message(caught.value.errors(), {"model": "m", "messages": HI, **fields})


def completion_error(**fields: Any) -> tuple[str, str | None]:
    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate({"model": "m", "prompt": "x", **fields})
    return validation_message(caught.value.errors(), {"model": "m", "prompt": "x", **fields})


def test_openai_shapes_are_accepted() -> None:
    request = ChatCompletionRequest.model_validate({
        "model": "m", "stop": "END", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "developer", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann"}],
        "prediction": {"type": "content", "content": [{"type": "text", "text": "hello"}]},
        "n": 1, "logprobs": False, "tool_choice": "none", "response_format": {"type": "text"},
        "metadata": {"k": "v"}, "store": False, "priority": -2, "speculative": False, "seed": 7})
    assert request.stop == ["END"] and request.include_usage and request.priority == -2
    for stop in (None, [], ["a", "b"]):
        assert ChatCompletionRequest.model_validate({"model": "m", "messages": HI, "stop": stop}).stop == stop


def test_completion_prompt_forms() -> None:
    for prompt, expected in (("x", "x"), ([1, 2], [1, 2]), (["x"], "x"), ([[3]], [3])):
        assert CompletionRequest.model_validate({"model": "m", "prompt": prompt}).prompt == expected
    assert completion_error(prompt=["a", "b"])[0] == "prompt: send one prompt per request (got a batch of 2)"
    assert completion_error(prompt=5) == ("prompt: the value should be a string or a list", "prompt")


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"frobnicate": 1}, "frobnicate", "unsupported field"),
    ({"n": 9}, "n", "at most 8"),
    ({"max_tokens": "5"}, "max_tokens", "integer"),
    ({"temperature": True}, "temperature", "number"),
    ({"stop": [""]}, "stop[0]", "at least 1 character"),
    ({"stop": ["x"] * 17}, "stop", "at most 16"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "'user'"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]", "tool_call_id"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "c"}]}, "messages[0]", "matches no tool call"),
    ({"top_logprobs": 3}, "top_logprobs", "logprobs=true"),
    ({"logit_bias": {"x": 1}}, "logit_bias", "token ids"),
    ({"tools": [_TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice", "no tool"),
    ({"tools": [_TOOL, _TOOL]}, "tools", "unique"),
    ({"tools": [_TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "cannot be combined"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex", "at most one"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "a string or a list"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "stream=true"),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "required"),
    ({"user": "u" * 257}, "user", "256"),
])
def test_messages_name_the_field(fields: dict[str, Any], param: str | None, words: str) -> None:
    message, got_param = chat_error(**fields)
    assert got_param == param
    assert words in message
    assert len(message) < 300


def test_a_huge_invalid_list_gives_one_short_message() -> None:
    message, param = chat_error(stop=[""] * 1_000_000)
    assert param == "stop" and len(message) < 200


def test_validation_message_of_broken_json() -> None:
    errors = [{"type": "json_invalid", "loc": ("body", 12), "msg": "JSON decode error",
               "ctx": {"error": "Expecting value"}}]
    assert validation_message(errors) == ("the body is not valid JSON (Expecting value at character 12)", None)


def test_agent_fields_are_accepted() -> None:
    request = ChatCompletionRequest.model_validate({
        "model": "m", "n": 3, "logprobs": True, "top_logprobs": 20, "logit_bias": {"50": -100, "7": 2.5},
        "tools": [_TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": False,
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]}]})
    assert request.tool_mode == "named" and request.num_choices == 3
    schema = {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True}}
    assert ChatCompletionRequest.model_validate({"model": "m", "messages": HI, "response_format": schema}
                                                ).constraint_fields == ["response_format"]
    for extra in ({"structured_outputs": {"json": {"type": "object"}}}, {"guided_choice": ["a", "b"]},
                  {"guided_json": '{"type": "object"}'}):
        assert CompletionRequest.model_validate({"model": "m", "prompt": "x", "logprobs": 5, **extra}).constraint_fields
    assert completion_error(logprobs=6)[1] == "logprobs"


def test_a_tools_parameters_must_be_a_schema_but_may_use_keywords_no_grammar_implements() -> None:
    """Under tool_choice "auto" the schema is the model's to read: ``format: uri`` and
    ``uniqueItems`` (pydantic's and MCP's) pass; a schema that is no schema does not."""
    def tools(parameters: Any) -> dict[str, Any]:
        return {"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}]}

    fine = {"type": "object", "properties": {"url": {"type": "string", "format": "uri"},
                                             "tags": {"type": "array", "uniqueItems": True, "items": {"type": "string"}}},
            "$defs": {"n": {"type": ["object", "null"], "properties": {"next": {"$ref": "#/$defs/n"}}}}}
    ChatCompletionRequest.model_validate({"model": "m", "messages": HI, **tools(fine)})
    for parameters, words in (({"type": "nonsense"}, "'nonsense' is not a JSON type"),
                              ({"properties": {"a": {"type": 42}}}, "properties.a.type: 42"),
                              ({"$ref": "#/defs/x"}, "points at nothing"),
                              ({"anyOf": {"type": "string"}}, "anyOf: a list of schemas")):
        message, param = chat_error(**tools(parameters))
        assert param == "tools[0].function.parameters" and words in message, message


def test_tool_call_ids_are_unique_within_a_message_not_across_turns() -> None:
    call = {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    turns = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_0", "content": "1"}]
    # a later round may number its calls from 0 again
    ChatCompletionRequest.model_validate({"model": "m", "messages": turns + turns[1:]})
    message, param = chat_error(messages=[turns[0], {"role": "assistant", "tool_calls": [call, call]}])
    assert param == "messages[1]" and "its own id" in message
