"""``POST /v1/responses``: OpenAI's Responses API, stateless, as an adapter over chat.

A Responses body is validated here (``ResponsesRequest``), translated into the JSON of a
chat completion request (``chat_body``) and run through the chat endpoint's own pipeline;
the chat answer — a ``chat.completion`` body, or the ``chat.completion.chunk`` events of
a stream — is translated back into a ``response`` object (``response_from_chat``) or the
Responses event stream (``ResponseStream``). The adapter reads and writes only OpenAI's
wire formats, so whatever the chat endpoint accepts (tools, response formats) the
Responses endpoint accepts too, and whatever it rejects comes back unchanged.

Nothing is stored: ``previous_response_id`` and ``store: true`` are 400s that say to send
the whole conversation in ``input``. The translations are pure functions of dicts, so the
tests feed them hand-written chat bodies and chunks.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse, Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
)

from speclane.server.errors import APIError, validation_message
from speclane.server.protocol import (
    INT32_MAX,
    INT32_MIN,
    MAX_USER_CHARS,
    ChatCompletionRequest,
    neutral_values,
)
from speclane.server.streaming import EventStreamResponse

STATELESS = ("this server is stateless and stores no responses: send the whole conversation "
             "(earlier messages, function calls and their outputs) in 'input'")
MAX_NAME_CHARS = 64  # of a tool type named in an error message
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


# -- request ---------------------------------------------------------------------------------


class InputText(_Strict):
    """A text part of an input message; ``output_text`` parts (an earlier answer sent back)
    may carry the ``annotations`` and ``logprobs`` they came with, which are ignored."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class InputMessage(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]
    id: str | None = None  # an earlier output item sent back: accepted, not used
    status: ItemStatus | None = None


class FunctionCallItem(_Strict):
    """A function call the model made earlier (an output item sent back as input)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(_Strict):
    """The result of a function call, for the model to read."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: ItemStatus | None = None


def _item_kind(value: Any) -> str | None:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("message", "function_call", "function_call_output") else None


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_kind, custom_error_type="input_item_type",
                  custom_error_message="an input item is a message ({\"role\", \"content\"}), a "
                                       "'function_call' or a 'function_call_output'"),
]


def _input_kind(value: Any) -> str | None:
    return "str" if isinstance(value, str) else "list" if isinstance(value, list) else None


Input = Annotated[
    Annotated[Annotated[str, Field(min_length=1)], Tag("str")]
    | Annotated[Annotated[list[InputItem], Field(min_length=1)], Tag("list")],
    Discriminator(_input_kind, custom_error_type="input_type",
                  custom_error_message="input is a string or a list of items"),
]


class FunctionTool(_Strict):
    """Responses' flat function tool; chat nests the same fields under ``function``."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceFunction(_Strict):
    type: Literal["function"]
    name: str


class FormatText(_Strict):
    type: Literal["text"]


class FormatJSONObject(_Strict):
    type: Literal["json_object"]


class FormatJSONSchema(_Strict):
    type: Literal["json_schema"]
    name: str
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[FormatText | FormatJSONObject | FormatJSONSchema, Field(discriminator="type")]


class TextConfig(_Strict):
    format: TextFormat | None = None


# Fields OpenAI defines that only their neutral value fits here: (is it neutral, why not).
_NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "previous_response_id": (lambda v: v is None, STATELESS),
    "store": (lambda v: v is None or v is False, STATELESS + "; omit 'store' or send false"),
    "background": (lambda v: v is None or v is False, "not supported: omit the field"),
    "truncation": (lambda v: v in (None, "disabled"), "only 'disabled' is supported: shorten the input instead"),
    "include": (lambda v: v is None or v == [], "not supported: omit the field"),
    "reasoning": (lambda v: v is None, "not supported by this model: omit the field"),
    "top_logprobs": (lambda v: v in (None, 0), "not supported: omit the field"),
}


class ResponsesRequest(_Strict):
    model: str
    input: Input
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, description="default: the rest of the context")
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, le=INT32_MAX, description="0 or -1: no top-k cut")
    stream: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    user: str | None = Field(default=None, max_length=MAX_USER_CHARS)
    metadata: dict[str, str] | None = None  # echoed, not stored
    priority: int = Field(default=0, ge=INT32_MIN, le=INT32_MAX, description="lower is more urgent")
    speculative: bool = Field(default=True, description="false keeps the request out of the lane")
    service_tier: str | None = None  # accepted, ignored: use priority
    previous_response_id: None = Field(default=None, description="stateless: must be null")
    store: Literal[False] | None = Field(default=None, description="stateless: false or absent")
    background: Literal[False] | None = None
    truncation: Literal["disabled"] | None = None
    include: Annotated[list[str], Field(max_length=0)] | None = None
    reasoning: None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=0)

    _only_neutral = neutral_values(_NEUTRAL)

    @field_validator("tools", mode="before")
    @classmethod
    def _only_function_tools(cls, value: Any) -> Any:
        if isinstance(value, list):
            for index, tool in enumerate(value):
                kind = tool.get("type") if isinstance(tool, dict) else None
                if isinstance(kind, str) and kind != "function":
                    raise ValueError(f"tools[{index}] has type '{kind[:MAX_NAME_CHARS]}', which this server "
                                     "does not support: only {\"type\": \"function\"} tools are")
        return value

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _only_function_choice(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type") != "function":
            raise ValueError('only "none", "auto", "required" or {"type": "function", "name"} are supported')
        return value


# -- request -> chat ----------------------------------------------------------------------------


def _text(content: str | list[InputText]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def chat_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as chat messages: function calls join the assistant
    turn they follow (``tool_calls``), their outputs become ``role: "tool"`` messages."""
    messages: list[dict[str, Any]] = []
    if request.instructions is not None:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
        return messages
    for item in request.input:
        if isinstance(item, InputMessage):
            messages.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
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
             "top_p": request.top_p, "top_k": request.top_k, "user": request.user, "metadata": request.metadata,
             "parallel_tool_calls": request.parallel_tool_calls, "service_tier": request.service_tier}
    body.update({key: value for key, value in plain.items() if value is not None})
    if request.priority != 0:
        body["priority"] = request.priority
    if not request.speculative:
        body["speculative"] = False
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
    if head not in _CHAT_PARAMS:
        return error
    if head == "messages":  # an index in it counts chat messages, so say so
        message = f"input (as chat messages): {error.message}" if error.message.startswith("messages") \
            else error.message
    else:
        message = error.message.replace(head, _CHAT_PARAMS[head], 1)
    return APIError(error.status, message, param=_CHAT_PARAMS[head], code=error.code, headers=error.headers)


# -- chat -> response ----------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_id(chat_id: Any) -> str:
    """``resp_<hex>`` with the chat completion's hex (the engine's request id) when there is one."""
    if isinstance(chat_id, str) and chat_id.startswith("chatcmpl-") and len(chat_id) > len("chatcmpl-"):
        return "resp_" + chat_id[len("chatcmpl-"):]
    return new_id("resp")


def echo_fields(request: ResponsesRequest) -> dict[str, Any]:
    """What a response repeats of its request (the SDK's ``Response`` requires some)."""
    return {
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "tools": [tool.model_dump(exclude_none=True) for tool in request.tools or []],
        "tool_choice": (request.tool_choice.model_dump() if isinstance(request.tool_choice, ToolChoiceFunction)
                        else request.tool_choice or "auto"),
        "parallel_tool_calls": True if request.parallel_tool_calls is None else request.parallel_tool_calls,
        "text": {"format": (request.text.format.model_dump(by_alias=True, exclude_none=True)
                            if request.text is not None and request.text.format is not None
                            else {"type": "text"})},
        "metadata": request.metadata or {},
        "user": request.user,
        "previous_response_id": None,
        "store": False,
        "background": False,
        "truncation": "disabled",
        "reasoning": None,
        "service_tier": "default",
        "top_logprobs": 0,
    }


def response_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat's ``usage`` in Responses' names; speclane's ``speculative`` counters ride along."""
    if usage is None:
        return None
    out: dict[str, Any] = {
        "input_tokens": usage.get("prompt_tokens", 0),
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": usage.get("completion_tokens", 0),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.get("total_tokens", 0),
    }
    if "speculative" in usage:
        out["speculative"] = usage["speculative"]
    return out


def _status(finish_reason: Any) -> tuple[str, dict[str, Any] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def response_object(*, rid: str, created_at: float, model: str, echo: dict[str, Any], status: str,
                    output: list[dict[str, Any]], usage: dict[str, Any] | None,
                    incomplete_details: dict[str, Any] | None = None,
                    error: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": rid, "object": "response", "created_at": created_at, "status": status,
        "completed_at": time.time() if status == "completed" else None,
        "error": error, "incomplete_details": incomplete_details, "model": model, "output": output,
        "usage": usage,
    }
    body.update(echo)
    return body


def message_item(text: str, *, status: str = "completed", refusal: str | None = None,
                 item_id: str | None = None) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text or refusal is None:
        content.append({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    if refusal is not None:
        content.append({"type": "refusal", "refusal": refusal})
    return {"type": "message", "id": item_id or new_id("msg"), "status": status, "role": "assistant",
            "content": content}


def function_call_item(call: dict[str, Any], *, status: str = "completed") -> dict[str, Any]:
    function = call.get("function") or {}
    return {"type": "function_call", "id": new_id("fc"), "call_id": call.get("id") or new_id("call"),
            "name": function.get("name") or "", "arguments": function.get("arguments") or "", "status": status}


def response_from_chat(chat: dict[str, Any], echo: dict[str, Any]) -> dict[str, Any]:
    """A ``chat.completion`` body -> a ``response`` object: the message's text (if any, or
    if there is nothing else) as a message item, then one ``function_call`` item per tool call.
    A cut answer (``length``) is ``incomplete``, and so is its message item; the function
    calls are whole (chat returns only calls that parsed) and ``completed``."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    status, details = _status(choice.get("finish_reason"))
    item_status = "incomplete" if status == "incomplete" else "completed"
    text = message.get("content") or ""
    calls = message.get("tool_calls") or []
    output: list[dict[str, Any]] = []
    if text or message.get("refusal") is not None or not calls:
        output.append(message_item(text, status=item_status, refusal=message.get("refusal")))
    output += [function_call_item(call) for call in calls]  # chat gives only whole calls
    return response_object(rid=response_id(chat.get("id")), created_at=chat.get("created", time.time()),
                           model=chat.get("model", ""), echo=echo, status=status, output=output,
                           usage=response_usage(chat.get("usage")), incomplete_details=details)


class ResponseStream:
    """Chat completion chunks in, Responses events out (each a dict with ``type`` and
    ``sequence_number``, counted from 0).

    ``feed`` takes one chunk, ``finish`` ends the stream (``response.completed``, or
    ``response.incomplete`` when chat's finish reason is ``length``), ``fail`` ends it
    with an ``error`` event and ``response.failed``. Items open one at a time: text opens a
    message item (with one ``output_text`` part), a tool call index not seen before opens
    a ``function_call`` item; opening one closes the one before. Event payloads are
    snapshots: later events never change earlier ones.
    """

    def __init__(self, echo: dict[str, Any], *, model: str = "") -> None:
        self.echo = echo
        self.model = model
        self.id = ""
        self.created_at = 0.0
        self.sequence = 0
        self.started = False
        self.ended = False
        self.output: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _response(self, status: str, **fields: Any) -> dict[str, Any]:
        return response_object(rid=self.id, created_at=self.created_at, model=self.model, echo=self.echo,
                               status=status, output=copy.deepcopy(self.output), **fields)

    def _start(self, chunk: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        if self.started:
            return []
        self.started = True
        chunk = chunk or {}
        self.id = response_id(chunk.get("id"))
        self.created_at = chunk.get("created", time.time())
        self.model = chunk.get("model", self.model)
        return [self._event("response.created", response=self._response("in_progress", usage=None)),
                self._event("response.in_progress", response=self._response("in_progress", usage=None))]

    def _close_current(self, status: str = "completed") -> list[dict[str, Any]]:
        item, self.current = self.current, None
        if item is None:
            return []
        index = self.output.index(item)
        item["status"] = status
        events: list[dict[str, Any]] = []
        if item["type"] == "message":
            part = item["content"][0]
            events += [self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=part["text"], logprobs=[]),
                       self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=copy.deepcopy(part))]
        else:
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=index, arguments=item["arguments"]))
        events.append(self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item)))
        return events

    def _open(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close_current()
        self.output.append(item)
        self.current = item
        index = len(self.output) - 1
        added = copy.deepcopy(item)
        if item["type"] == "message":
            added["content"] = []  # as OpenAI: the part comes in its own event
        events.append(self._event("response.output_item.added", output_index=index, item=added))
        if item["type"] == "message":
            events.append(self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                      content_index=0, part=copy.deepcopy(item["content"][0])))
        return events

    def _text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self.current is None or self.current["type"] != "message":
            events += self._open(message_item("", status="in_progress"))
        item = self.current
        assert item is not None
        item["content"][0]["text"] += text
        events.append(self._event("response.output_text.delta", item_id=item["id"],
                                  output_index=self.output.index(item), content_index=0, delta=text,
                                  logprobs=[]))
        return events

    def _tool_call(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        index = delta.get("index", 0)
        function = delta.get("function") or {}
        item = self.calls.get(index)
        if item is None:
            item = function_call_item({"id": delta.get("id"), "function": {"name": function.get("name")}},
                                      status="in_progress")
            self.calls[index] = item
            events += self._open(item)
        elif function.get("name") and not item["name"]:
            item["name"] = function["name"]
        arguments = function.get("arguments")
        if arguments:
            item["arguments"] += arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=self.output.index(item), delta=arguments))
        return events

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """One ``chat.completion.chunk`` (the usage chunk included)."""
        events = self._start(chunk)
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._tool_call(call)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
        return events

    def finish(self) -> list[dict[str, Any]]:
        """The end of the chat stream (``[DONE]``): close the open item, the final response."""
        if self.ended:
            return []
        events = self._start()
        status, details = _status(self.finish_reason)
        if not self.output:  # an empty answer is still one (empty) message, as non-streamed
            events += self._open(message_item("", status="in_progress"))
        cut = status == "incomplete" and self.current is not None and self.current["type"] == "message"
        events += self._close_current("incomplete" if cut else "completed")
        self.ended = True
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return events + [self._event(kind, response=self._response(
            status, usage=response_usage(self.usage), incomplete_details=details))]

    def fail(self, error: dict[str, Any]) -> list[dict[str, Any]]:
        """The chat stream ended with ``{"error": ...}``: an ``error`` event, then ``response.failed``."""
        if self.ended:
            return []
        events = self._start()
        self.ended = True
        if self.current is not None:
            self.current["status"] = "incomplete"
            self.current = None
        message = str(error.get("message") or "the request failed")
        events.append(self._event("error", code=error.get("code"), message=message, param=error.get("param")))
        events.append(self._event("response.failed", response=self._response(
            "failed", usage=response_usage(self.usage), error={"code": "server_error", "message": message})))
        return events


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


# -- response models (the schema in /openapi.json) -------------------------------------------------


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputRefusal(BaseModel):
    type: Literal["refusal"] = "refusal"
    refusal: str


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[Annotated[OutputText | OutputRefusal, Field(discriminator="type")]]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int
    speculative: dict[str, Any] | None = None


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: float
    completed_at: float | None
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    model: str
    output: list[Annotated[OutputMessage | OutputFunctionCall, Field(discriminator="type")]]
    usage: ResponseUsage | None
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    text: dict[str, Any]
    metadata: dict[str, str]
    user: str | None
    previous_response_id: None
    store: bool
    background: bool
    truncation: str
    reasoning: None
    service_tier: str
    top_logprobs: int
