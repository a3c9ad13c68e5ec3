"""``POST /v1/responses``: OpenAI's Responses API, stateless, as an adapter over chat.

A Responses body is validated (``ResponsesRequest``, in ``responses_protocol.py``),
translated here into the JSON of a chat completion request (``chat_body``) and run through
the chat endpoint's own pipeline; the chat answer — a ``chat.completion`` body, or the
``chat.completion.chunk`` events of a stream — is translated back into a ``response``
object (``responses_output.py``) or the Responses event stream (``responses_stream.py``). The adapter reads and writes only OpenAI's
wire formats, so whatever the chat endpoint accepts (tools, response formats) the
Responses endpoint accepts too, and whatever it rejects comes back unchanged.

Nothing is stored: ``previous_response_id`` and ``store: true`` are 400s that say to send
the whole conversation in ``input``. The translations are pure functions of dicts, so the
tests feed them hand-written chat bodies and chunks.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from speclane.server.errors import APIError, validation_message
from speclane.server.protocol import ChatCompletionRequest
from speclane.server.responses_output import echo_fields, response_from_chat
from speclane.server.responses_protocol import (
    FormatJSONObject,
    FormatJSONSchema,
    FormatText,
    FunctionCallItem,
    FunctionTool,
    InputMessage,
    InputText,
    ReasoningItem,
    ResponsesRequest,
    ToolChoiceFunction,
)
from speclane.server.responses_stream import ResponseStream
from speclane.server.streaming import EventStreamResponse

STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# -- request -> chat ----------------------------------------------------------------------------


def _text(content: str | list[InputText]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def chat_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as chat messages: function calls join the assistant
    turn they follow (``tool_calls``), their outputs become ``role: "tool"`` messages, and
    a reasoning item is the ``reasoning_content`` of the assistant turn after it."""
    messages: list[dict[str, Any]] = []
    if request.instructions is not None:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
        return messages
    thinking: str | None = None  # a reasoning item's, for the next assistant turn
    for item in request.input:
        if isinstance(item, ReasoningItem):
            thinking = (thinking or "") + item.text
            continue
        if isinstance(item, InputMessage):
            messages.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and thinking is None:
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
        if thinking is not None and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning_content"] = thinking
        thinking = None  # thinking before anything but an assistant turn reads as nothing
    return messages


def chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    for key in ("description", "parameters", "strict"):
        if getattr(tool, key) is not None:
            function[key] = getattr(tool, key)
    return {"type": "function", "function": function}


def chat_tool_choice(choice: str | ToolChoiceFunction) -> str | dict[str, Any]:
    return choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}


def chat_response_format(fmt: FormatText | FormatJSONObject | FormatJSONSchema) -> dict[str, Any]:
    if not isinstance(fmt, FormatJSONSchema):
        return {"type": fmt.type}
    schema: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema_}
    if fmt.description is not None:
        schema["description"] = fmt.description
    if fmt.strict is not None:
        schema["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": schema}


def chat_body(request: ResponsesRequest) -> dict[str, Any]:
    """The chat completion request (as JSON) that answers ``request``."""
    body: dict[str, Any] = {"model": request.model, "messages": chat_messages(request)}
    plain = {"max_completion_tokens": request.max_output_tokens, "temperature": request.temperature,
             "top_p": request.top_p, "top_k": request.top_k, "user": request.user,
             "safety_identifier": request.safety_identifier, "metadata": request.metadata,
             "parallel_tool_calls": request.parallel_tool_calls, "service_tier": request.service_tier}
    body.update({key: value for key, value in plain.items() if value is not None})
    if request.priority != 0:
        body["priority"] = request.priority
    if not request.speculative:
        body["speculative"] = False
    if request.cache_scope != "tenant":
        body["cache_scope"] = request.cache_scope
    if request.tools:
        body["tools"] = [chat_tool(tool) for tool in request.tools]
    if request.tool_choice is not None:
        body["tool_choice"] = chat_tool_choice(request.tool_choice)
    if request.text is not None and request.text.format is not None:
        body["response_format"] = chat_response_format(request.text.format)
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


_FLAT_TOOL = re.compile(r"^(tools\[\d+\]\.)function\.")
# chat's field -> the Responses field it came from, for the chat endpoint's own 400s
_CHAT_PARAMS = {"messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text.format"}


def chat_request(request: ResponsesRequest) -> ChatCompletionRequest:
    """``chat_body`` validated as the chat endpoint validates it; what it rejects is a 400
    naming the Responses field."""
    try:
        return ChatCompletionRequest.model_validate_json(json.dumps(chat_body(request)))
    except ValidationError as exc:
        message, param = validation_message(exc.errors())
        raise in_responses_terms(APIError(400, message, param=param)) from None


def in_responses_terms(error: APIError) -> APIError:
    """A chat error that names a chat field, naming the Responses field instead (status,
    code and headers unchanged)."""
    head = (error.param or "").split(".")[0].split("[")[0]
    if head == "tools" and error.param and (flat := _FLAT_TOOL.sub(r"\1", error.param)) != error.param:
        # Responses' function tools are flat: tools[i].parameters, not tools[i].function.parameters
        return APIError(error.status, error.message.replace(error.param, flat), param=flat, code=error.code,
                        headers=error.headers)
    if head not in _CHAT_PARAMS:
        return error
    if head == "messages":  # an index in it counts chat messages, so say so
        message = f"input (as chat messages): {error.message}" if error.message.startswith("messages") \
            else error.message
    else:
        message = error.message.replace(head, _CHAT_PARAMS[head], 1)
    return APIError(error.status, message, param=_CHAT_PARAMS[head], code=error.code, headers=error.headers)


# -- chat -> response ----------------------------------------------------------------------------


# -- HTTP ------------------------------------------------------------------------------------------


def sse_event(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


async def relay(chat_events: AsyncIterator[bytes], stream: ResponseStream) -> AsyncIterator[bytes]:
    """The chat endpoint's SSE bytes -> the Responses SSE bytes. Closing this closes
    ``chat_events`` (which aborts the engine request if it is still running)."""
    buffer = b""
    try:
        async for raw in chat_events:
            buffer += raw
            while b"\n\n" in buffer:
                frame, buffer = buffer.split(b"\n\n", 1)
                data = b"".join(line[len(b"data:"):].strip() for line in frame.split(b"\n")
                                if line.startswith(b"data:"))
                if not data:
                    continue
                if data == b"[DONE]":
                    for event in stream.finish():
                        yield sse_event(event)
                    return
                payload = json.loads(data)
                events = (stream.fail(payload["error"] if isinstance(payload["error"], dict) else {})
                          if "error" in payload else stream.feed(payload))
                for event in events:
                    yield sse_event(event)
        for event in stream.finish():  # a chat stream always ends with [DONE]; be safe anyway
            yield sse_event(event)
    finally:
        with contextlib.suppress(Exception):
            await chat_events.aclose()  # type: ignore[attr-defined]


ChatGenerate = Callable[[ChatCompletionRequest], Awaitable[Response]]


async def create_response(request: ResponsesRequest, generate: ChatGenerate) -> Response:
    """Answer ``request`` through ``generate`` (the chat pipeline): a ``response`` object,
    or its event stream. The chat pipeline's errors pass through, with the Responses
    field names (``max_output_tokens``, ``input``, ``text.format``) in place of chat's."""
    chat = chat_request(request)
    echo = echo_fields(request)
    try:
        answer = await generate(chat)
    except APIError as exc:
        raise in_responses_terms(exc) from None
    if request.stream:
        if not isinstance(answer, EventStreamResponse):
            return answer
        events = relay(answer.body_iterator, ResponseStream(echo, model=request.model))  # type: ignore[arg-type]
        return EventStreamResponse(events, on_close=answer.on_close, headers=STREAM_HEADERS)
    if not isinstance(answer, JSONResponse) or answer.status_code != 200:
        return answer
    return JSONResponse(response_from_chat(json.loads(bytes(answer.body)), echo))
