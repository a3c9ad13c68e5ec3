"""Engine outputs -> OpenAI response bodies and server-sent events.

A stream is: (chat only) a chunk with ``delta.role``; one chunk per engine output with
new text; a chunk with an empty delta and the ``finish_reason``; with
``stream_options.include_usage`` a last chunk with no choices and the ``usage`` (every
earlier chunk then carries ``"usage": null``, as OpenAI does); then ``data: [DONE]``.
A request the server had to cancel (shutdown) or that failed in the engine ends with
an ``{"error": ...}`` event instead of the finish chunk, then ``data: [DONE]``.
Leaving a stream early closes the engine stream, which aborts the request; the HTTP
side of that (a client that hangs up) is ``EventStreamResponse`` for streams and
``until_disconnect`` for plain responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from speclane.engine.engine import RequestOutput
from speclane.server.errors import APIError

T = TypeVar("T")
DONE = b"data: [DONE]\n\n"
CANCELLED = ("abort", "error")  # finish reasons that mean "no complete answer"


@dataclass(frozen=True)
class ResponseMeta:
    """What every chunk and response of one request repeats."""

    chat: bool
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def new(cls, *, chat: bool, model: str) -> ResponseMeta:
        prefix = "chatcmpl" if chat else "cmpl"
        return cls(chat=chat, model=model, id=f"{prefix}-{uuid.uuid4().hex}")

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def chunk(meta: ResponseMeta, *, text: str | None = None, role: bool = False, finish_reason: str | None = None,
          include_usage: bool = False) -> dict[str, Any]:
    if meta.chat:
        delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    body: dict[str, Any] = {"id": meta.id, "object": meta.chunk_object, "created": meta.created,
                            "model": meta.model, "choices": [choice]}
    if include_usage:
        body["usage"] = None
    return body


def usage_chunk(meta: ResponseMeta, final: RequestOutput) -> dict[str, Any]:
    return {"id": meta.id, "object": meta.chunk_object, "created": meta.created, "model": meta.model,
            "choices": [], "usage": final.usage}


async def sse_events(
    meta: ResponseMeta,
    outputs: AsyncIterator[RequestOutput],
    *,
    include_usage: bool,
    cancelled_error: Callable[[RequestOutput], APIError],
) -> AsyncIterator[bytes]:
    """The event stream of one request; ``cancelled_error`` says why an aborted one ended."""
    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        if meta.chat:
            yield sse(chunk(meta, role=True, include_usage=include_usage))
        try:
            async for out in outputs:
                if out.finished and out.finish_reason in CANCELLED:
                    yield sse(cancelled_error(out).body())
                    break
                if out.text:
                    yield sse(chunk(meta, text=out.text, include_usage=include_usage))
                if out.finished:
                    yield sse(chunk(meta, finish_reason=out.finish_reason, include_usage=include_usage))
                    if include_usage:
                        yield sse(usage_chunk(meta, out))
                    break
        except RuntimeError as exc:  # the engine stopped: say so, do not hang the client
            yield sse(APIError(500, f"the engine failed: {exc}").body())
        yield DONE


async def collect(outputs: AsyncIterator[RequestOutput]) -> tuple[str, RequestOutput]:
    """The whole text and the final output of a non-streaming request."""
    parts: list[str] = []
    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        async for out in outputs:
            parts.append(out.text)
            if out.finished:
                return "".join(parts), out
    raise RuntimeError("the engine stream ended without a final output")


def response_body(meta: ResponseMeta, text: str, final: RequestOutput) -> dict[str, Any]:
    if meta.chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": final.finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": final.finish_reason}
        obj = "text_completion"
    return {"id": meta.id, "object": obj, "created": meta.created, "model": meta.model,
            "choices": [choice], "usage": final.usage}


# -- HTTP: streaming responses and disconnects ----------------------------------------


class EventStreamResponse(StreamingResponse):
    """Server-sent events. However the response ends — finished, failed, or the client
    went away (Starlette then cancels the body) — the body iterator is closed at once,
    not when it is garbage-collected, and ``on_close`` runs even if the body never
    started (a client gone before the first byte)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], *, on_close: Callable[[], None],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(content, headers=headers)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            finally:
                self.on_close()


async def until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Run ``work``; if the client disconnects first, cancel it (aborting the request) and return None."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    if task.cancelled() or not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
