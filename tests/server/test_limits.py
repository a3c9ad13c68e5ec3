"""The body size limit on a tiny ASGI app, without a model: 413 in OpenAI's shape before the
app sees a byte; bodies within the limit pass through whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from speclane.server.limits import BodyLimitMiddleware

LIMIT = 1000


class EchoSize:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await JSONResponse({"size": len(body)})(scope, receive, send)


@pytest.fixture
def app() -> EchoSize:
    return EchoSize()


def client(app: EchoSize) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=BodyLimitMiddleware(app, LIMIT)),
                             base_url="http://test")


async def _post(app: EchoSize, content: object) -> httpx.Response:
    async with client(app) as c:
        return await c.post("/", content=content)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, 1, LIMIT])
def test_within_the_limit_passes_whole(app: EchoSize, size: int) -> None:
    response = asyncio.run(_post(app, b"x" * size))
    assert response.status_code == 200 and response.json() == {"size": size}


def test_declared_too_large_is_413_without_calling_the_app(app: EchoSize) -> None:
    response = asyncio.run(_post(app, b"x" * (LIMIT + 1)))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert app.calls == 0


def test_streamed_too_large_is_413(app: EchoSize) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 300

    response = asyncio.run(_post(app, chunks()))
    assert response.status_code == 413 and app.calls == 0
