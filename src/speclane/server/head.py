"""``HEAD`` wherever ``GET`` is served (HTTP requires it; load balancers probe ``/health``
with it): the request runs as a ``GET`` and its answer goes out without the body, headers
(``Content-Length`` included) as the ``GET`` would send them. FastAPI's routes name only
the methods they are declared with, so without this a ``HEAD /health`` is a 405."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGetMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, without_body)
