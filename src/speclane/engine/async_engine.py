"""The asyncio front: one engine thread ticks; coroutines add requests and read streams.

``generate`` may be called from any event loop (a web server's): it queues the
request (errors such as "queue full" are raised right away) and returns an async
iterator of ``RequestOutput``. Leaving the iterator early (a client that went away)
aborts the request: its KV is freed and, if it held the lane, the lane passes on at
the next tick boundary.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from speclane.config import StreamPacing
from speclane.engine.engine import LLMEngine, RequestOutput
from speclane.engine.stream_mailbox import StreamMailbox, paced_interval_s, read_stream
from speclane.kernels.build import release_thread_pool
from speclane.request import SamplingParams


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.stream_pacing = StreamPacing()  # read_stream's (serve sets it)
        self._streams: dict[str, StreamMailbox] = {}
        self._streams_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="speclane-engine", daemon=True)
        self.error: BaseException | None = None
        start_ticking(self._thread)

    # -- public ---------------------------------------------------------------------------
    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
        **options: Any,
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and return its stream (an async generator)."""
        rid = request_id or uuid.uuid4().hex
        mailbox = StreamMailbox(asyncio.get_running_loop())
        with self._streams_lock:  # under the lock that _failed sets the error in: no stream registers unfailed
            if self.error is not None:
                raise RuntimeError(f"the engine stopped after an internal error: {self.error}")
            if rid in self._streams:
                raise ValueError(f"request id {rid!r} is already in use")
            self._streams[rid] = mailbox
        try:
            self.engine.add_request(rid, prompt_token_ids, sampling, **options)
        except BaseException:
            with self._streams_lock:
                if self._streams.get(rid) is mailbox:  # only our own entry
                    del self._streams[rid]
            raise
        self._wake.set()
        return self._stream(rid, mailbox)

    def _stream(self, rid: str, mailbox: StreamMailbox) -> AsyncIterator[RequestOutput]:
        def closed(finished: bool) -> None:
            with self._streams_lock:
                self._streams.pop(rid, None)
            if not finished:  # the consumer left early: cancel the work
                self.abort(rid)

        return read_stream(mailbox, closed, lambda: paced_interval_s(self.stream_pacing, self.num_streams))

    def abort(self, request_id: str) -> None:
        self.engine.abort_request(request_id)
        self._wake.set()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    @property
    def num_streams(self) -> int:
        with self._streams_lock:
            return len(self._streams)

    # -- the engine thread ----------------------------------------------------------------
    def _loop(self) -> None:
        tick_until_stopped(self.engine, self._wake, self._stop, self._deliver_all, self._failed)

    def _deliver_all(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            self._deliver(out.request_id, out)

    def _failed(self, exc: BaseException) -> None:  # never leave clients hanging on a dead engine
        with self._streams_lock:
            self.error = exc
        self._fail_all(exc)

    def _deliver(self, rid: str, item: RequestOutput | BaseException) -> None:
        with self._streams_lock:
            mailbox = self._streams.get(rid)
            if mailbox is None:
                return
            if isinstance(item, RequestOutput) and item.finished:
                del self._streams[rid]  # delivered its end: nothing more will come for it
        mailbox.put(item)

    def _fail_all(self, exc: BaseException) -> None:
        with self._streams_lock:
            rids = list(self._streams)
        for rid in rids:
            self._deliver(rid, RuntimeError(f"engine error: {exc}"))


def start_ticking(thread: threading.Thread) -> None:
    """Start the thread that ticks an engine built on this one. The OpenMP workers this
    thread kept from building the model (and calibrating it) would only make every barrier
    of the engine thread's forwards sleep (``build.release_thread_pool``), so they go first."""
    release_thread_pool()
    thread.start()


def tick_until_stopped(engine: LLMEngine, wake: threading.Event, stop: threading.Event,
                       deliver: Callable[[list[RequestOutput]], None],
                       failed: Callable[[BaseException], None]) -> None:
    """The engine thread: tick while there is work (else sleep until ``wake``), hand each
    tick's outputs to ``deliver``; an exception from the engine goes to ``failed`` and ends it."""
    while not stop.is_set():
        if not engine.has_unfinished():
            wake.wait(0.5)
            wake.clear()
            continue
        try:
            outputs = engine.step()
        except BaseException as exc:
            failed(exc)
            return
        deliver(outputs)
