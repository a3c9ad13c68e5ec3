"""What a request body must be before anything parses it: within the size limit, and
free of lone UTF-16 surrogates.

A pure ASGI middleware: it reads the body itself, counting bytes, and answers 413 in
OpenAI's error shape once the limit is passed — before JSON parsing or validation see a
byte. The rest of an oversized body is read and thrown away (up to ``DRAIN_CAP_BYTES``)
so that a client which writes its whole body before reading, as most do, receives the
413 instead of a reset connection. A body within the limit is handed to the app whole;
later ``receive`` calls (disconnect detection) go straight to the server.

JSON may escape half of a surrogate pair alone (``"\\ud800"``), which Python's parser and
pydantic accept as a string that cannot be encoded: the tokenizer raises on it, and as a
``user`` (a tenant) it would break every later ``/metrics`` scrape (a label that cannot be
encoded). Such a body is answered 400 here; a body with no surrogate escape at all (nearly
every one) is not parsed.
"""

from __future__ import annotations

import json
import re

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from speclane.server.errors import error_body

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DRAIN_CAP_BYTES = 256 * 1024 * 1024  # past this an oversized body is not read: the connection closes


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1; got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            if declared <= DRAIN_CAP_BYTES:
                await _drain(receive)
            await self._too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before it finished sending: nobody to answer
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body_bytes:
                if message.get("more_body", False):
                    await _drain(receive, size)
                await self._too_large(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = b"".join(chunks)
        if _has_lone_surrogate(whole):
            message = ("the body holds a lone UTF-16 surrogate escape (such as \\ud800 without its pair): "
                       "strings must be valid Unicode")
            await JSONResponse(error_body(400, message), status_code=400)(scope, receive, send)
            return
        await self.app(scope, _replay(whole, receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit_mb = self.max_body_bytes / (1024 * 1024)
        body = error_body(413, f"the request body is larger than the {limit_mb:g} MiB limit: send a smaller request")
        await JSONResponse(body, status_code=413)(scope, receive, send)


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(body: bytes) -> bool:
    """A JSON body whose strings hold half a surrogate pair (a pair is one character)."""
    if not _SURROGATE_ESCAPE.search(body):
        return False
    try:
        value = json.loads(body)
    except ValueError:
        return False  # not JSON: the app says so
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _drain(receive: Receive, size: int = 0) -> None:
    """Read and discard the rest of the body, up to ``DRAIN_CAP_BYTES`` in all."""
    while size <= DRAIN_CAP_BYTES:
        message = await receive()
        if message["type"] != "http.request":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
