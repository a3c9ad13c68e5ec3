"""Live requests, draining on SIGTERM, and the uvicorn server that drains before it stops.

Shutdown, in order: the first SIGTERM (or SIGINT) sets ``draining`` — new requests get
503 and ``/health`` says so, while the listening socket stays open so clients hear it
rather than "connection refused"; running requests get ``grace_s`` seconds to finish;
those still running are then aborted, and their clients get an error event (streams)
or a 503 (non-streaming); then uvicorn closes connections and the process exits 0.
A second signal ends the grace period at once (the same aborts, the same events and exit
0); a third goes to uvicorn (a SIGINT forces its exit; a SIGTERM starts its own shutdown,
after which the process ends by that signal).
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from speclane.server.errors import APIError

if TYPE_CHECKING:
    from speclane.cluster.front import ClusterEngine
    from speclane.engine.async_engine import AsyncEngine

logger = logging.getLogger("speclane.server")

DEFAULT_GRACE_S = 30.0
ABORT_WAIT_S = 5.0  # after aborting, how long to wait for handlers to tell their clients


class RequestTracker:
    """The requests an app is generating for, and the drain that ends them."""

    def __init__(self, async_engine: AsyncEngine | ClusterEngine) -> None:
        self.async_engine = async_engine
        self.draining = False
        self._live: set[str] = set()
        self._cancelled: set[str] = set()  # aborted by the drain, not by their client
        self._hurry = False  # the grace period ends now (a second signal)

    @property
    def num_live(self) -> int:
        return len(self._live)

    def check_admitting(self) -> None:
        if self.draining:
            raise APIError(503, "the server is shutting down: retry on another server or later",
                           headers={"Retry-After": "5"})

    def start(self, request_id: str) -> None:
        self._live.add(request_id)

    def done(self, request_id: str) -> None:
        self._live.discard(request_id)
        self._cancelled.discard(request_id)

    def cancelled_error(self, request_id: str, finish_reason: str | None, error: str | None = None,
                        bad_request: bool = False) -> APIError:
        """Why a request ended without an answer (its client is still listening)."""
        if bad_request:  # the engine could not go on with what the request asked (its grammar)
            return APIError(400, error or "the request could not be completed", code="grammar_failed")
        if request_id in self._cancelled or self.draining:
            return APIError(503, "the server is shutting down and cancelled this request after its grace "
                                 "period: retry it on another server or later", code="shutting_down")
        if finish_reason == "error":
            return APIError(500, f"the engine failed on this request: {error or 'unknown error'}", code="engine_stopped")
        return APIError(503, "the request was cancelled by the server: retry it", code="cancelled")

    def hurry(self) -> None:
        """End the drain's grace period now: abort what is still running."""
        self._hurry = True

    async def drain(self, grace_s: float) -> None:
        """Stop admitting, give live requests ``grace_s`` to finish (or until ``hurry``),
        then abort the rest."""
        self.draining = True
        logger.info("draining: %d request(s) running, grace %.1f s", len(self._live), grace_s)
        await self._wait_idle(grace_s, hurried=True)
        if self._live:
            logger.warning("grace period over: aborting %d request(s)", len(self._live))
            for rid in list(self._live):
                self._cancelled.add(rid)
                self.async_engine.abort(rid)
            await self._wait_idle(ABORT_WAIT_S)

    async def _wait_idle(self, timeout_s: float, *, hurried: bool = False) -> None:
        deadline = time.monotonic() + timeout_s
        while self._live and time.monotonic() < deadline and not (hurried and self._hurry):
            await asyncio.sleep(0.05)


class DrainingServer(uvicorn.Server):
    """uvicorn, except that the first SIGTERM/SIGINT drains the tracker before stopping."""

    def __init__(self, config: uvicorn.Config, tracker: RequestTracker, grace_s: float = DEFAULT_GRACE_S) -> None:
        super().__init__(config)
        self.tracker = tracker
        self.grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_started = False
        self._hurried = False
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler; also safe to call from another thread (tests). The first signal
        drains, a second ends the grace period; neither reaches uvicorn, which would close the
        listening socket at once and raise the signal again after serving (SIGTERM's exit
        143, before the engine shuts down). A third goes to uvicorn."""
        if self._loop is not None and not self.should_exit:
            if not self._drain_started:
                self._drain_started = True
                self._loop.call_soon_threadsafe(self._start_drain)
                return
            if not self._hurried:
                self._hurried = True
                logger.info("a second signal: ending the grace period now")
                self._loop.call_soon_threadsafe(self.tracker.hurry)
                return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await self.tracker.drain(self.grace_s)
        finally:
            self.should_exit = True

