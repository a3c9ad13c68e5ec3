"""A request's outputs on their way from the thread that makes them to the event loop that
streams them, and the reading of them as a stream (``read_stream``).

Every wake-up of a server's event loop is a thread scheduled onto the cores the engine's
forward runs on: it takes a core from one of the forward's threads, and each of the
forward's barriers then waits for that thread. So the mailbox wakes the reader's loop only
for an output the reader waits for and may take now: at most once per chunk the reader
takes, however many outputs the engine thread puts meanwhile. A paced reader
(``--stream-interval-ms``) is due a set time after its last chunk; an output put before
then waits for the first put after it (the engine's next tick, or the stream's end, which
is never held back) and goes with it, so pacing costs no timer wake-ups of its own. Only an
output left early with nothing after it (a stream that stalls) is taken by a timer,
``STALL_S`` after the reader was due. With many streams open the interval grows with their
number (``paced_interval_s``): the server's chunks a second, not each stream's, are what
the engine's cores pay for.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from functools import reduce

from speclane.config import StreamPacing
from speclane.engine.engine import RequestOutput

Item = RequestOutput | BaseException  # an output, or the error that ends the stream
# An output put before its reader was due, with no output after it to carry it, is taken
# this long after the reader was due (a stream whose tick stalled: a preempted request, a
# long prefill beside it). A stream that keeps ticking never waits for this timer.
STALL_S = 0.1


def paced_interval_s(pacing: StreamPacing, open_streams: int) -> float:
    """A stream's interval between chunks, in seconds: ``pacing.interval_ms``, or with more
    than ``pacing.pace_streams`` streams open (0: never) that times ``open_streams /
    pace_streams``, so the chunks of all of them together come about as often as
    ``pace_streams`` streams' at the interval."""
    interval_s = pacing.interval_ms / 1000.0
    if pacing.pace_streams <= 0 or open_streams <= pacing.pace_streams:
        return interval_s
    return interval_s * open_streams / pacing.pace_streams


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _ends(item: Item) -> bool:
    return isinstance(item, BaseException) or item.finished


class StreamMailbox:
    """``put`` (any thread) adds an output; ``take`` (on ``loop``, one reader) returns every
    output put since the last take. Times are ``time.monotonic()``'s, which every thread reads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[Item] = []
        self._ended = False  # an item that ends the stream waits in _items
        self._waiter: asyncio.Future[None] | None = None  # the reader's, while it waits
        self._due = 0.0  # the waiting reader takes no output before this time, but an end

    def put(self, item: Item) -> None:
        with self._lock:
            self._items.append(item)
            self._ended |= _ends(item)
            waiter = self._waiter
            if waiter is None or not (self._ended or time.monotonic() >= self._due):
                return  # the reader is busy (it takes this with the rest) or not due yet
            self._waiter = None
        with contextlib.suppress(RuntimeError):  # the reader's loop is closed
            self._loop.call_soon_threadsafe(_settle, waiter)

    async def take(self, due: float = 0.0) -> list[Item]:
        """The outputs put since the last take, once there is one and it is ``due``
        (``time.monotonic()``) or later; an output that ends the stream is taken at once."""
        while True:
            now = time.monotonic()
            with self._lock:
                if self._items and (self._ended or now >= due):
                    items, self._items, self._ended = self._items, [], False
                    return items
                waiter = self._waiter = self._loop.create_future()
                self._due = due
            # Not due: a later put wakes it; this timer only for an early output left alone.
            stall = self._loop.call_later(due - now + STALL_S, _settle, waiter) if now < due else None
            try:
                await waiter
            finally:
                if stall is not None:
                    stall.cancel()
                with self._lock:
                    if self._waiter is waiter:
                        self._waiter = None


async def read_stream(mailbox: StreamMailbox, closed: Callable[[bool], None],
                      interval_s: float | Callable[[], float] = 0.0) -> AsyncIterator[RequestOutput]:
    """A request's outputs until its final one (an error in the mailbox is raised, after the
    outputs put before it); ``closed(finished)`` runs when the reader stops, ``finished``
    False if it left early.

    The outputs put while the reader was busy come as one (``RequestOutput.then``): a chunk
    per tick while the reader keeps up, fewer when it falls behind. ``interval_s`` (seconds,
    or a function read after each chunk: ``paced_interval_s`` of the streams open then)
    paces the stream: an output that comes sooner than that after the previous chunk waits,
    and goes with the first output put after the interval (``StreamMailbox``). The first output (time
    to first token) and the final one are never held back. Each output a server streams
    costs it a chunk to frame and write and its client one to parse, on the cores the
    engine's threads decode on."""
    interval = interval_s if callable(interval_s) else (lambda: interval_s)
    finished = False
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
            due = time.monotonic() + interval()
    finally:
        closed(finished)
