"""A chat completion's answer -> the Responses API's ``response`` object and its items.

Pure functions of dicts: the usage, the status (``incomplete`` when chat stopped for
length), a ``reasoning`` item (a reasoning model's thinking, chat's ``reasoning_content``),
a message item, one ``function_call`` item per tool call, and the echo of the
request's settings that a ``response`` repeats. ``responses_stream.py`` builds its events
from the same items.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from speclane.server.responses_protocol import ResponsesRequest, ToolChoiceFunction


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
        "input_tokens_details": {"cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
                                 "cache_write_tokens": 0},
        "output_tokens": usage.get("completion_tokens", 0),
        "output_tokens_details": {"reasoning_tokens": usage.get("completion_tokens_details", {}).get("reasoning_tokens", 0)},
        "total_tokens": usage.get("total_tokens", 0),
    }
    if "speculative" in usage:
        out["speculative"] = usage["speculative"]
    return out


def response_status(finish_reason: Any) -> tuple[str, dict[str, Any] | None]:
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


def reasoning_item(text: str, *, status: str = "completed") -> dict[str, Any]:
    """A reasoning model's thinking, in full (``content``; no summary is made)."""
    return {"type": "reasoning", "id": new_id("rs"), "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def function_call_item(call: dict[str, Any], *, status: str = "completed") -> dict[str, Any]:
    function = call.get("function") or {}
    return {"type": "function_call", "id": new_id("fc"), "call_id": call.get("id") or new_id("call"),
            "name": function.get("name") or "", "arguments": function.get("arguments") or "", "status": status}


def response_from_chat(chat: dict[str, Any], echo: dict[str, Any]) -> dict[str, Any]:
    """A ``chat.completion`` body -> a ``response`` object: the thinking (if any) as a
    reasoning item, the message's text (if any, or if there is nothing else but thinking)
    as a message item, then one ``function_call`` item per tool call.
    A cut answer (``length``) is ``incomplete``, and so is its message item; the function
    calls are whole (chat returns only calls that parsed) and ``completed``."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    status, details = response_status(choice.get("finish_reason"))
    item_status = "incomplete" if status == "incomplete" else "completed"
    text = message.get("content") or ""
    calls = message.get("tool_calls") or []
    output: list[dict[str, Any]] = []
    thinking = message.get("reasoning_content")
    if thinking:  # an item always follows it (the message, empty where the answer never began)
        output.append(reasoning_item(thinking))
    if text or message.get("refusal") is not None or not calls:
        output.append(message_item(text, status=item_status, refusal=message.get("refusal")))
    output += [function_call_item(call) for call in calls]  # chat gives only whole calls
    return response_object(rid=response_id(chat.get("id")), created_at=chat.get("created", time.time()),
                           model=chat.get("model", ""), echo=echo, status=status, output=output,
                           usage=response_usage(chat.get("usage")), incomplete_details=details)
