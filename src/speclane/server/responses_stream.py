"""Chat completion chunks -> the Responses API's event stream (``ResponseStream``)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

from speclane.server.responses_output import (
    function_call_item,
    message_item,
    reasoning_item,
    response_id,
    response_object,
    response_status,
    response_usage,
)

# The items text streams into: how one is made, its delta event, that event's other fields.
TEXT_ITEMS: dict[str, tuple[Callable[..., dict[str, Any]], str, dict[str, Any]]] = {
    "reasoning": (reasoning_item, "response.reasoning_text.delta", {}),
    "message": (message_item, "response.output_text.delta", {"logprobs": []}),
}


class ResponseStream:
    """Chat completion chunks in, Responses events out (each a dict with ``type`` and
    ``sequence_number``, counted from 0).

    ``feed`` takes one chunk, ``finish`` ends the stream (``response.completed``, or
    ``response.incomplete`` when chat's finish reason is ``length``), ``fail`` ends it
    with an ``error`` event and ``response.failed``. Items open one at a time: thinking
    (``reasoning_content``) opens a reasoning item (its ``reasoning_text`` deltas), text opens a
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
        if item["type"] == "reasoning":
            events.append(self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                      content_index=0, text=item["content"][0]["text"]))
        elif item["type"] == "message":
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

    def _append(self, kind: str, text: str) -> list[dict[str, Any]]:
        """``text`` into the open item of ``kind`` (``TEXT_ITEMS``), opened first if it is not."""
        make, delta_event, extra = TEXT_ITEMS[kind]
        events: list[dict[str, Any]] = []
        if self.current is None or self.current["type"] != kind:
            events += self._open(make("", status="in_progress"))
        item = self.current
        assert item is not None
        item["content"][0]["text"] += text
        events.append(self._event(delta_event, item_id=item["id"], output_index=self.output.index(item),
                                  content_index=0, delta=text, **extra))
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
            if delta.get("reasoning_content"):
                events += self._append("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                events += self._append("message", delta["content"])
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
        status, details = response_status(self.finish_reason)
        if not any(item["type"] != "reasoning" for item in self.output):  # as non-streamed: an empty
            events += self._open(message_item("", status="in_progress"))  # answer is an empty message
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
            "failed", usage=response_usage(self.usage), error={"code": _failed_code(error), "message": message})))
        return events


def _failed_code(error: dict[str, Any]) -> str:
    """``response.failed``'s code, one of those OpenAI's schema lists (the SDK refuses others):
    a failure the request caused (its grammar: ``grammar_failed``) is ``invalid_prompt``."""
    return "invalid_prompt" if error.get("code") == "grammar_failed" else "server_error"
