"""A request's outputs on their way from the thread that makes them to the event loop that
streams them, and the reading of them as a stream (``read_stream``).

Every wake-up of a server's event loop is a thread scheduled onto the cores the engine's
forward runs on: it takes a core from one of the forward's threads, and each of the
forward's barriers then waits for that thread. So the mailbox wakes the reader's loop only
when the reader waits for an output it may take now: at most once per ``take``, however
many outputs the engine thread puts meanwhile, and never for an output that comes before a
paced reader is due (``--stream-interval-ms``), unless it ends the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from functools import reduce

from speclane.engine.engine import RequestOutput

Item = RequestOutput | BaseException  # an output, or the error that ends the stream
# A paced reader less than this short of its due time is due: uvloop's timers (libuv's)
# count whole milliseconds, so a shorter wait would be woken early, again and again, each
# wake-up a turn of the loop that finds the reader still not due.
TIMER_SLACK_S = 0.001


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _ends(item: Item) -> bool:
    return isinstance(item, BaseException) or item.finished


class StreamMailbox:
    """``put`` (any thread) adds an output; ``take`` (on ``loop``, one reader) returns every
    output put since the last take."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[Item] = []
        self._ended = False  # an item that ends the stream waits in _items
        self._waiter: asyncio.Future[None] | None = None  # the reader's, while it waits
        self._wake_on_any = False  # the waiting reader is due: any item wakes it, not only an end

    def put(self, item: Item) -> None:
        with self._lock:
            self._items.append(item)
            self._ended |= _ends(item)
            waiter = self._waiter
            if waiter is None or not (self._wake_on_any or self._ended):
                return  # the reader is busy (it takes this with the rest) or not due yet
            self._waiter = None
        with contextlib.suppress(RuntimeError):  # the reader's loop is closed
            self._loop.call_soon_threadsafe(_settle, waiter)

    async def take(self, due: float = 0.0) -> list[Item]:
        """The outputs put since the last take, once there is one and the loop's clock has
        reached ``due``; an output that ends the stream is taken at once."""
        loop = self._loop
        while True:
            now = loop.time() + TIMER_SLACK_S
            with self._lock:
                if self._items and (self._ended or now >= due):
                    items, self._items, self._ended = self._items, [], False
                    return items
                waiter = self._waiter = loop.create_future()
                self._wake_on_any = now >= due
            timer = loop.call_at(due, _settle, waiter) if now < due else None
            try:
                await waiter
            finally:
                if timer is not None:
                    timer.cancel()
                with self._lock:
                    if self._waiter is waiter:
                        self._waiter = None


async def read_stream(mailbox: StreamMailbox, closed: Callable[[bool], None],
                      interval_s: float = 0.0) -> AsyncIterator[RequestOutput]:
    """A request's outputs until its final one (an error in the mailbox is raised, after the
    outputs put before it); ``closed(finished)`` runs when the reader stops, ``finished``
    False if it left early.

    The outputs put while the reader was busy come as one (``RequestOutput.then``): a chunk
    per tick while the reader keeps up, fewer when it falls behind. ``interval_s`` paces the
    stream: an output that comes sooner than that after the previous one was taken waits,
    and the outputs that come meanwhile join it. The first output (time to first token) and
    the final one are never held back. Each output a server streams costs it a chunk to
    frame and write and its client one to parse, on the cores the engine's threads decode on."""
    finished = False
    loop = asyncio.get_running_loop()
    due = 0.0  # the first output is taken as soon as it comes
    try:
        while True:
            items = await mailbox.take(due)
            error = next((i for i, item in enumerate(items) if isinstance(item, BaseException)), None)
            outputs: list[RequestOutput] = items[:error]  # type: ignore[assignment]
            if outputs:
                out = reduce(RequestOutput.then, outputs)
                yield out
                if out.finished:
                    finished = True
                    return
            if error is not None:
                raise items[error]  # type: ignore[misc]
            due = loop.time() + interval_s
    finally:
        closed(finished)
