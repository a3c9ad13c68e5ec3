"""``POST /v1/responses``: the translation both ways as pure functions (hand-written chat
bodies and chunks, tool calls included), and the endpoint against the real server and
model through the ``openai`` SDK (text equal to chat's greedy answer, instructions,
message lists, usage, incomplete answers, the event stream, bad input, hang-ups)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError
from server_helpers import MODEL, LiveServer, engine_idle, wait_until

from speclane.engine.async_engine import AsyncEngine
from speclane.server.errors import validation_message
from speclane.server.protocol import ChatCompletionRequest
from speclane.server.responses import chat_body, chat_request, relay
from speclane.server.responses_output import echo_fields, response_from_chat
from speclane.server.responses_protocol import ResponseObject, ResponsesRequest
from speclane.server.responses_stream import ResponseStream

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
QUESTION = "Name three colors."


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate_json(json.dumps({"model": MODEL, **fields}))


def rejection(**fields: Any) -> tuple[str, str | None]:
    """The 400's message and param, as the server words them (it has the body)."""
    with pytest.raises(ValidationError) as info:
        request(**fields)
    return validation_message(info.value.errors(), {"model": MODEL, **fields})


# -- request -> chat ---------------------------------------------------------------------------


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    body = chat_body(request(input="hi", instructions="Be brief.", max_output_tokens=7, temperature=0,
                             top_p=0.5, user="u1", metadata={"k": "v"}, priority=-2, speculative=False))
    assert body == {"model": MODEL, "messages": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "hi"}],
                    "max_completion_tokens": 7, "temperature": 0.0, "top_p": 0.5, "user": "u1",
                    "metadata": {"k": "v"}, "priority": -2, "speculative": False}
    assert chat_request(request(input="hi")).messages[0].content == "hi"


def test_items_become_chat_messages_with_tool_calls_and_tool_results() -> None:
    body = chat_body(request(input=[
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                                        {"type": "input_text", "text": "in Oslo?"}]},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Oslo"}',
         "id": "fc_1", "status": "completed"},
        {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Rain at noon.", "annotations": []}]},
        {"role": "assistant", "content": "Checking."},
        {"type": "function_call", "call_id": "c3", "name": "weather", "arguments": "{}"},
    ], stream=True))
    assert body["messages"] == [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
        {"role": "assistant", "content": "Rain at noon."},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
    ]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_reasoning_items_sent_back_are_the_next_assistant_turns_thinking() -> None:
    """A multi-turn client sends a response's whole output back: its reasoning items too."""
    thinking = {"type": "reasoning", "id": "rs_1", "summary": [], "status": "completed",
                "content": [{"type": "reasoning_text", "text": "They want weather."}]}
    body = chat_body(request(input=[
        {"role": "user", "content": "Weather?"}, thinking,
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        {**thinking, "content": None, "summary": [{"type": "summary_text", "text": "Report it."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Rain."}]},
        {"role": "user", "content": "Thanks"}]))
    assert body["messages"][1] == {"role": "assistant", "content": None, "reasoning_content": "They want weather.",
                                   "tool_calls": [{"id": "c1", "type": "function",
                                                   "function": {"name": "weather", "arguments": "{}"}}]}
    assert body["messages"][3] == {"role": "assistant", "content": "Rain.", "reasoning_content": "Report it."}
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool", "assistant", "user"]
    ChatCompletionRequest.model_validate(body)  # and chat takes it


def test_tools_tool_choice_and_text_formats_take_chat_shapes() -> None:
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    body = chat_body(request(
        input="x", tools=[{"type": "function", "name": "weather", "description": "Forecast.", "parameters": params,
                           "strict": True}, {"type": "function", "name": "clock"}],
        tool_choice={"type": "function", "name": "weather"}, parallel_tool_calls=False))
    assert body["tools"] == [
        {"type": "function", "function": {"name": "weather", "description": "Forecast.", "parameters": params,
                                          "strict": True}},
        {"type": "function", "function": {"name": "clock"}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert body["parallel_tool_calls"] is False
    assert chat_body(request(input="x", tool_choice="required"))["tool_choice"] == "required"

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True, "description": "A thing."}
    assert chat_body(request(input="x", text={"format": fmt}))["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "description": "A thing.",
                                               "strict": True}}
    assert chat_body(request(input="x", text={"format": {"type": "json_object"}}))["response_format"] == {
        "type": "json_object"}
    assert chat_body(request(input="x", text={"format": {"type": "text"}}))["response_format"] == {"type": "text"}
    assert "response_format" not in chat_body(request(input="x", text={}))
    echo = echo_fields(request(input="x", text={"format": fmt}))
    assert echo["text"] == {"format": fmt}


@pytest.mark.parametrize(("fields", "param", "word"), [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
    ({"input": "x", "store": True}, "store", "stateless"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "web_search"),
    ({"input": "x", "tools": [{"type": "function", "name": "f"}, {"type": "file_search"}]}, "tools", "file_search"),
    ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, "tool_choice", "function"),
    ({"input": "x", "frobnicate": 1}, "frobnicate", "unsupported field"),
    ({"input": ""}, "input", "at least 1"),
    ({"input": []}, "input", "at least 1"),
    ({"input": 5}, "input", "string or a list"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0]", "function_call"),
    ({"input": [{"role": "user", "content": []}]}, "input[0]", "at least one part"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type", "input_text"),
    ({"input": [{"type": "function_call_output", "call_id": 5, "output": "x"}]}, "input[0].call_id", "string"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x", "schema": 5}}}, "text.format.schema",
     "an object"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "required"),
    ({}, "input", "required"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "greater"),
    ({"input": "x", "temperature": 3}, "temperature", "less"),
    ({"input": "x", "include": ["message.output_text.logprobs"]}, "include", "not supported"),
    ({"input": "x", "truncation": "auto"}, "truncation", "disabled"),
])
def test_bad_requests_say_which_field(fields: dict[str, Any], param: str, word: str) -> None:
    message, got = rejection(**fields)
    assert got == param, message
    assert word in message, message


def test_store_false_and_neutral_values_are_accepted() -> None:
    request(input="x", store=False, previous_response_id=None, truncation="disabled", include=[],
            background=False, reasoning=None, service_tier="auto", top_logprobs=0)


# -- chat -> response ---------------------------------------------------------------------------


def chat_completion(message: dict[str, Any], finish_reason: str = "stop") -> dict[str, Any]:
    return {"id": "chatcmpl-0123abcd", "object": "chat.completion", "created": 1700000000, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "logprobs": None,
                         "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15,
                      "speculative": {"rounds": 1}}}


def parsed(body: dict[str, Any]) -> Response:
    ResponseObject.model_validate(body)  # the schema we publish
    return Response.model_validate(body)  # the SDK's


def test_a_chat_answer_becomes_one_message_item() -> None:
    body = response_from_chat(chat_completion({"content": "Red, blue."}), echo_fields(request(input="x")))
    resp = parsed(body)
    assert resp.id == "resp_0123abcd" and resp.object == "response" and resp.created_at == 1700000000
    assert resp.status == "completed" and resp.incomplete_details is None and resp.error is None
    assert resp.output_text == "Red, blue."
    [item] = body["output"]
    assert item["type"] == "message" and item["id"].startswith("msg_") and item["status"] == "completed"
    assert item["content"] == [{"type": "output_text", "text": "Red, blue.", "annotations": [], "logprobs": []}]
    assert body["usage"] == {"input_tokens": 11, "output_tokens": 4, "total_tokens": 15,
                             "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                             "output_tokens_details": {"reasoning_tokens": 0}, "speculative": {"rounds": 1}}
    assert (body["tools"], body["tool_choice"], body["parallel_tool_calls"]) == ([], "auto", True)


def test_a_cut_answer_is_incomplete() -> None:
    body = response_from_chat(chat_completion({"content": "Red"}, "length"), echo_fields(request(input="x")))
    resp = parsed(body)
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert body["output"][0]["status"] == "incomplete" and body["completed_at"] is None


def test_tool_calls_become_function_call_items() -> None:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}},
             {"id": "call_2", "type": "function", "function": {"name": "clock", "arguments": "{}"}}]
    body = response_from_chat(chat_completion({"content": None, "tool_calls": calls}, "tool_calls"),
                              echo_fields(request(input="x")))
    resp = parsed(body)
    assert resp.status == "completed" and resp.output_text == ""
    assert [(i["type"], i["call_id"], i["name"], i["arguments"], i["status"]) for i in body["output"]] == [
        ("function_call", "call_1", "weather", '{"city":"Oslo"}', "completed"),
        ("function_call", "call_2", "clock", "{}", "completed")]
    assert all(i["id"].startswith("fc_") for i in body["output"])
    with_text = response_from_chat(chat_completion({"content": "Let me check.", "tool_calls": calls[:1]},
                                                   "tool_calls"), echo_fields(request(input="x")))
    assert [i["type"] for i in with_text["output"]] == ["message", "function_call"]
    cut = parsed(response_from_chat(chat_completion({"content": "<tool_call>\n{", "tool_calls": calls[:1]},
                                                    "length"), echo_fields(request(input="x"))))
    assert cut.status == "incomplete"
    assert [(i.type, i.status) for i in cut.output] == [("message", "incomplete"), ("function_call", "completed")]


def test_thinking_becomes_a_reasoning_item_before_the_answer() -> None:
    body = response_from_chat(chat_completion({"content": "Blue.", "reasoning_content": "Sky colour."}),
                              echo_fields(request(input="x")))
    resp = parsed(body)
    assert resp.output_text == "Blue." and [i.type for i in resp.output] == ["reasoning", "message"]
    item = body["output"][0]
    assert item["id"].startswith("rs_") and item["summary"] == []
    assert item["content"] == [{"type": "reasoning_text", "text": "Sky colour."}]
    counted = chat_completion({"content": "Blue.", "reasoning_content": "Sky colour."})
    counted["usage"]["completion_tokens_details"] = {"reasoning_tokens": 3}
    usage = parsed(response_from_chat(counted, echo_fields(request(input="x")))).usage
    assert usage is not None and usage.output_tokens_details.reasoning_tokens == 3
    cut = parsed(response_from_chat(chat_completion({"content": "", "reasoning_content": "Hm"}, "length"),
                                    echo_fields(request(input="x"))))
    assert [(i.type, i.status) for i in cut.output] == [("reasoning", "completed"), ("message", "incomplete")]


# -- chat chunks -> events ----------------------------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish_reason: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-feed", "object": "chat.completion.chunk", "created": 1700000001, "model": MODEL,
            "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}],
            "usage": None}


USAGE_CHUNK = {"id": "chatcmpl-feed", "object": "chat.completion.chunk", "created": 1700000001, "model": MODEL,
               "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}


def run_stream(chunks: list[dict[str, Any]], *, error: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    stream = ResponseStream(echo_fields(request(input="x")), model=MODEL)
    events = [event for c in chunks for event in stream.feed(c)]
    events += stream.fail(error) if error is not None else stream.finish()
    for number, event in enumerate(events):
        assert event["sequence_number"] == number
        EVENTS.validate_python(event)  # every event parses as the SDK's type
    return events


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def test_streamed_text_events() -> None:
    events = run_stream([chunk({"role": "assistant", "content": ""}), chunk({"content": "Red"}),
                         chunk({"content": ", blue"}), chunk(finish_reason="stop"), USAGE_CHUNK])
    assert kinds(events) == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert events[0]["response"]["id"] == "resp_feed"
    added = events[2]
    assert added["item"]["status"] == "in_progress" and added["item"]["content"] == []
    assert events[3]["part"] == {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d["delta"] for d in deltas] == ["Red", ", blue"]
    assert {(d["item_id"], d["output_index"], d["content_index"]) for d in deltas} == {(added["item"]["id"], 0, 0)}
    assert events[6]["text"] == "Red, blue"
    assert events[8]["item"]["status"] == "completed"
    final = Response.model_validate(events[-1]["response"])
    assert final.status == "completed" and final.output_text == "Red, blue"
    assert final.usage is not None and final.usage.total_tokens == 12 and final.usage.output_tokens == 3


def test_streamed_cut_text_is_incomplete() -> None:
    events = run_stream([chunk({"role": "assistant", "content": ""}), chunk({"content": "Red"}),
                         chunk(finish_reason="length"), USAGE_CHUNK])
    assert kinds(events)[-1] == "response.incomplete"
    final = events[-1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"
    assert [e for e in events if e["type"] == "response.output_item.done"][0]["item"]["status"] == "incomplete"


def test_streamed_tool_call_deltas() -> None:
    events = run_stream([
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Checking."}),
        chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "weather", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                               "function": {"name": "clock", "arguments": "{}"}}]}),
        chunk(finish_reason="tool_calls"), USAGE_CHUNK])
    cut = run_stream([chunk({"tool_calls": [{"index": 0, "id": "call_c", "type": "function",
                                             "function": {"name": "clock", "arguments": "{}"}}]}),
                      chunk(finish_reason="length"), USAGE_CHUNK])
    assert cut[-1]["type"] == "response.incomplete" and cut[-1]["response"]["output"][0]["status"] == "completed"
    assert kinds(events) == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    first_call = events[8]["item"]
    assert (first_call["type"], first_call["call_id"], first_call["name"], first_call["arguments"],
            first_call["status"]) == ("function_call", "call_a", "weather", "", "in_progress")
    assert events[8]["output_index"] == 1 and events[13]["output_index"] == 2
    assert events[11]["arguments"] == '{"city":"Oslo"}' and events[11]["item_id"] == first_call["id"]
    assert events[12]["item"]["arguments"] == '{"city":"Oslo"}' and events[12]["item"]["status"] == "completed"
    final = Response.model_validate(events[-1]["response"])
    assert final.status == "completed" and final.output_text == "Checking."
    assert [(i.type, getattr(i, "name", None)) for i in final.output] == [
        ("message", None), ("function_call", "weather"), ("function_call", "clock")]


def test_an_error_event_fails_the_response() -> None:
    events = run_stream([chunk({"role": "assistant", "content": ""}), chunk({"content": "Red"})],
                        error={"message": "the server is shutting down", "type": "server_error", "param": None,
                               "code": "cancelled"})
    assert kinds(events)[-2:] == ["error", "response.failed"]
    assert events[-2]["code"] == "cancelled" and "shutting down" in events[-2]["message"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert failed["output"][0]["status"] == "incomplete"


def test_streamed_thinking_is_a_reasoning_item_then_the_message() -> None:
    events = run_stream([chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": "Sky"}),
                         chunk({"reasoning_content": " colour."}), chunk({"content": "Blue."}),
                         chunk(finish_reason="stop"), USAGE_CHUNK])
    assert kinds(events)[2:7] == ["response.output_item.added", "response.reasoning_text.delta",
                                  "response.reasoning_text.delta", "response.reasoning_text.done",
                                  "response.output_item.done"]
    assert events[5]["text"] == "Sky colour." and events[6]["item"]["content"][0]["text"] == "Sky colour."
    final = Response.model_validate(events[-1]["response"])
    assert final.output_text == "Blue." and [i.type for i in final.output] == ["reasoning", "message"]
    only_thinking = run_stream([chunk({"reasoning_content": "Hm"}), chunk(finish_reason="length"), USAGE_CHUNK])
    assert [i["type"] for i in only_thinking[-1]["response"]["output"]] == ["reasoning", "message"]


def test_an_empty_answer_is_an_empty_message() -> None:
    events = run_stream([chunk({"role": "assistant", "content": ""}), chunk(finish_reason="stop"), USAGE_CHUNK])
    assert Response.model_validate(events[-1]["response"]).output_text == ""
    assert "response.output_item.done" in kinds(events)


def sse(payload: Any) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"


class ChatEvents:
    """A chat event stream that records whether it was closed."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.gen()

    async def gen(self) -> AsyncIterator[bytes]:
        for frame in self.frames:
            yield frame

    async def aclose(self) -> None:
        self.closed = True


def test_relay_frames_events_and_closes_the_chat_stream() -> None:
    frames = [sse(chunk({"role": "assistant", "content": ""})), sse(chunk({"content": "Hi"})),
              sse(chunk(finish_reason="stop")) + sse(USAGE_CHUNK), sse(b"[DONE]")]

    async def read(limit: int | None) -> tuple[list[bytes], ChatEvents]:
        chat = ChatEvents(frames)
        out: list[bytes] = []
        events = relay(chat, ResponseStream(echo_fields(request(input="x"))))
        async for raw in events:
            out.append(raw)
            if limit is not None and len(out) == limit:
                break
        await events.aclose()  # type: ignore[attr-defined]
        return out, chat

    out, chat = asyncio.run(read(None))
    assert chat.closed
    for raw in out:
        head, data, blank = raw.decode().split("\n", 2)
        assert blank == "\n" and head.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[len("data: "):])["type"] == head[len("event: "):]
    assert out[-1].startswith(b"event: response.completed\n")
    _, chat = asyncio.run(read(2))  # a consumer that stops early still closes the chat stream
    assert chat.closed


# -- the real server ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat_text(client: openai.OpenAI, messages: list[Any], max_tokens: int) -> tuple[str, str | None]:
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0)
    return reply.choices[0].message.content or "", reply.choices[0].finish_reason


@pytest.mark.slow
def test_sdk_text_equals_the_chat_answer(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    resp = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0)
    expected, finish = chat_text(client, [{"role": "user", "content": QUESTION}], 24)
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.model == MODEL
    assert resp.output_text == expected and expected
    assert resp.status == ("incomplete" if finish == "length" else "completed")
    usage = resp.usage
    assert usage is not None and usage.input_tokens > 0 and 0 < usage.output_tokens <= 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    # Chat's prompt_tokens_details.cached_tokens: never the last prompt token. The same input
    # again (after the chat request's answer filled the block its prompt ended in): every
    # prompt token but the last.
    cached = usage.input_tokens_details.cached_tokens
    assert cached < usage.input_tokens
    again = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0).usage
    assert again is not None and again.input_tokens_details.cached_tokens == usage.input_tokens - 1
    assert resp.max_output_tokens == 24 and resp.temperature == 0


@pytest.mark.slow
def test_instructions_and_message_lists_are_chat_messages(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    system = "You answer in French."
    resp = client.responses.create(model=MODEL, input=QUESTION, instructions=system, max_output_tokens=16,
                                   temperature=0)
    expected, _ = chat_text(client, [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}],
                            16)
    assert resp.output_text == expected and resp.instructions == system
    turns: list[Any] = [{"role": "user", "content": "My name is Ada."},
                        {"type": "message", "role": "assistant",
                         "content": [{"type": "output_text", "text": "Hello Ada!", "annotations": []}]},
                        {"role": "user", "content": [{"type": "input_text", "text": "What is my name?"}]}]
    listed = client.responses.create(model=MODEL, input=turns, max_output_tokens=16, temperature=0)
    expected, _ = chat_text(client, [{"role": "user", "content": "My name is Ada."},
                                     {"role": "assistant", "content": "Hello Ada!"},
                                     {"role": "user", "content": "What is my name?"}], 16)
    assert listed.output_text == expected


@pytest.mark.slow
def test_a_cut_answer_is_incomplete_end_to_end(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    resp = client.responses.create(model=MODEL, input="Write a long story about a dragon.", max_output_tokens=16,
                                   temperature=0)
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage is not None and resp.usage.output_tokens == 16


@pytest.mark.slow
def test_the_event_stream(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    whole = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0)
    events = list(client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0,
                                          stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == (["response.created", "response.in_progress", "response.output_item.added",
                      "response.content_part.added"] + ["response.output_text.delta"] * deltas
                     + ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                        "response.completed" if whole.status == "completed" else "response.incomplete"])
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == text and final.status == whole.status
    assert final.usage is not None and whole.usage is not None
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens
    assert events[0].response.id == final.id  # type: ignore[union-attr]


@pytest.mark.slow
def test_json_schema_text_format(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"],
              "additionalProperties": False}
    fmt: Any = {"type": "json_schema", "name": "color", "schema": schema, "strict": True}
    try:
        resp = client.responses.create(model=MODEL, input="Name a color as JSON.", max_output_tokens=32,
                                       temperature=0, text={"format": fmt})
    except openai.BadRequestError as exc:  # a chat endpoint without structured outputs says so
        assert exc.body is not None and exc.param == "text.format", exc.message
        pytest.skip(f"the chat endpoint rejects json_schema: {exc.message}")
    if resp.status == "completed":
        assert set(json.loads(resp.output_text)) == {"color"}


@pytest.fixture(scope="module")
def http(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=120) as c:
        yield c


@pytest.mark.slow
@pytest.mark.parametrize(("fields", "param"), [
    ({"input": "x", "previous_response_id": "resp_123"}, "previous_response_id"),
    ({"input": "x", "store": True}, "store"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "frobnicate": True}, "frobnicate"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": "x", "max_output_tokens": 100_000}, "max_output_tokens"),
    # a strict tool's schema must compile; Responses' tools are flat
    ({"input": "x", "tools": [{"type": "function", "name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}]}, "tools[0].parameters"),
])
def test_bad_input_is_a_400_in_openai_shape(http: httpx.Client, fields: dict[str, Any], param: str) -> None:
    response = http.post("/v1/responses", json={"model": MODEL, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param, error


@pytest.mark.slow
def test_chat_errors_pass_through(http: httpx.Client) -> None:
    response = http.post("/v1/responses", json={"model": "no-such-model", "input": "x"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    streamed = http.post("/v1/responses", json={"model": "no-such-model", "input": "x", "stream": True})
    assert streamed.status_code == 404 and streamed.json()["error"]["code"] == "model_not_found"


@pytest.mark.slow
def test_a_hang_up_aborts_the_request(live: LiveServer, async_engine: AsyncEngine, idle_after: AsyncEngine) -> None:
    before = async_engine.engine.counters.snapshot()["generated_by_tenant"].get("hangup", 0)
    body = {"model": MODEL, "input": "Write a very long story about a dragon.", "max_output_tokens": 400,
            "temperature": 0, "stream": True, "user": "hangup"}
    with httpx.Client(base_url=live.url, timeout=120) as c, c.stream("POST", "/v1/responses", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("event: response.output_text.delta")
            if seen == 3:
                break
    wait_until(lambda: engine_idle(async_engine), timeout=60, what="the aborted request to leave the engine")
    generated = async_engine.engine.counters.snapshot()["generated_by_tenant"].get("hangup", 0) - before
    assert generated < 200, generated


WEATHER_TOOL: Any = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                    "required": ["city"], "additionalProperties": False}, "strict": True}


def forced_call(client: openai.OpenAI, **fields: Any) -> Any:
    try:
        return client.responses.create(model=MODEL, input="What is the weather in Paris?", max_output_tokens=48,
                                       temperature=0, tools=[WEATHER_TOOL],
                                       tool_choice={"type": "function", "name": "get_weather"}, **fields)
    except openai.BadRequestError as exc:  # a chat endpoint without tools says so
        assert exc.param in ("tools", "tool_choice"), exc.message
        pytest.skip(f"the chat endpoint rejects tools: {exc.message}")


@pytest.mark.slow
def test_function_calls_end_to_end(client: openai.OpenAI, idle_after: AsyncEngine) -> None:
    resp = forced_call(client)
    calls = [item for item in resp.output if item.type == "function_call"]
    assert calls, resp.output  # the grammar admits one call or more: the small model may run to the limit
    call = calls[0]
    assert call.name == "get_weather" and call.id.startswith("fc_") and call.call_id
    assert set(json.loads(call.arguments)) == {"city"}
    assert resp.tools[0].name == "get_weather"  # type: ignore[union-attr]

    events = list(forced_call(client, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e.item for e in events if e.type == "response.output_item.added"]  # type: ignore[union-attr]
    assert any(item.type == "function_call" and item.name == "get_weather" for item in added)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and done[0].arguments == call.arguments  # type: ignore[union-attr]
    first = done[0].item_id  # type: ignore[union-attr]
    deltas = "".join(e.delta for e in events  # type: ignore[union-attr]
                     if e.type == "response.function_call_arguments.delta" and e.item_id == first)
    assert deltas == call.arguments
    final = events[-1].response  # type: ignore[union-attr]
    assert [i.arguments for i in final.output if i.type == "function_call"] == [c.arguments for c in calls]
    assert events[-1].type in ("response.completed", "response.incomplete")

    answer = client.responses.create(model=MODEL, max_output_tokens=16, temperature=0, tools=[WEATHER_TOOL], input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C."}])
    assert answer.status in ("completed", "incomplete") and answer.output
