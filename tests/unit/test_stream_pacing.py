"""``read_stream`` and its mailbox: outputs put while the reader is busy come as one; the
pacing of ``speclane serve --stream-interval-ms`` (outputs that come within the interval
join the next chunk; the first and the final one are never held back); and the wake-ups of
the reader's loop: at most one per chunk, none for an output a paced reader is not due for."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from speclane.config import StreamPacing
from speclane.engine import stream_mailbox
from speclane.engine.engine import RequestOutput
from speclane.engine.stream_mailbox import StreamMailbox, read_stream
from speclane.request import TokenLogprob


def output(token: int, *, finished: bool = False, logprobs: bool = False) -> RequestOutput:
    return RequestOutput("r", f"<{token}>", [token], finished, "stop" if finished else None, 5, token,
                         speculative={"rounds": token},
                         logprobs=[TokenLogprob(token, -float(token), ())] if logprobs else None)


async def read_timed(interval_s: float, schedule: list[tuple[float, RequestOutput | BaseException]]
                     ) -> tuple[list[tuple[float, RequestOutput]], list[bool]]:
    """Put each item after its delay (seconds after the start); read the stream; return
    each yielded output with the seconds since the start, and what ``closed`` was told."""
    mailbox = StreamMailbox(asyncio.get_running_loop())
    closed: list[bool] = []
    start = time.monotonic()

    async def feed() -> None:
        for delay, item in schedule:
            await asyncio.sleep(max(0.0, start + delay - time.monotonic()))
            mailbox.put(item)

    feeder = asyncio.ensure_future(feed())
    got = []
    try:
        async for out in read_stream(mailbox, closed.append, interval_s):
            got.append((time.monotonic() - start, out))
    finally:
        await feeder
    return got, closed


def test_outputs_within_the_interval_join_one_chunk() -> None:
    schedule = [(0.0, output(1, logprobs=True))] + [(0.02 * i, output(i, logprobs=True)) for i in range(2, 6)]
    schedule.append((0.1, output(6, finished=True, logprobs=True)))
    got, closed = asyncio.run(read_timed(0.3, schedule))
    first_at, first = got[0]
    assert first.token_ids == [1] and first_at < 0.15, "the first output is not held back"
    rest = [out for _, out in got[1:]]
    assert len(rest) == 1, "the later outputs came within the interval: one chunk"
    joined = rest[0]
    assert joined.token_ids == [2, 3, 4, 5, 6] and joined.text == "<2><3><4><5><6>"
    assert [lp.token_id for lp in joined.logprobs or ()] == [2, 3, 4, 5, 6]
    assert joined.finished and joined.finish_reason == "stop"
    assert joined.completion_tokens == 6 and joined.speculative == {"rounds": 6}, "counts are the latest"
    assert got[1][0] < 0.25, "the final output ends the wait: it is not held for the interval"
    assert closed == [True]


def test_a_slow_stream_is_not_delayed() -> None:
    """Outputs further apart than the interval go out one by one, as they come."""
    schedule = [(0.06 * i, output(i, finished=i == 3)) for i in range(4)]
    got, _ = asyncio.run(read_timed(0.03, schedule))
    assert [out.token_ids for _, out in got] == [[0], [1], [2], [3]]
    for (at, _), (due, _) in zip(got, schedule, strict=True):
        assert at - due < 0.05


def test_a_fast_stream_is_paced() -> None:
    schedule = [(0.005 * i, output(i, finished=i == 59)) for i in range(60)]
    got, _ = asyncio.run(read_timed(0.05, schedule))
    assert [t for _, out in got for t in out.token_ids] == list(range(60)), "nothing lost or reordered"
    assert 3 <= len(got) <= 12, f"~0.3 s at one chunk per 0.05 s, not one per output: {len(got)}"
    times = [at for at, _ in got[:-1]]  # the final chunk is not held back
    assert all(later - earlier >= 0.045 for earlier, later in zip(times, times[1:], strict=False)), \
        "a chunk at most once per interval"


def test_no_interval_yields_each_output_the_reader_waits_for() -> None:
    async def read() -> list[list[int]]:
        mailbox = StreamMailbox(asyncio.get_running_loop())
        taken = asyncio.Event()
        chunks = []

        async def feed() -> None:
            for token in range(10):
                mailbox.put(output(token, finished=token == 9))
                await taken.wait()  # the reader has this one before the next comes
                taken.clear()

        feeder = asyncio.ensure_future(feed())
        async for out in read_stream(mailbox, lambda finished: None):
            chunks.append(out.token_ids)
            taken.set()
        await feeder
        return chunks

    assert asyncio.run(read()) == [[i] for i in range(10)]


def test_outputs_put_while_the_reader_is_busy_come_as_one() -> None:
    async def read() -> list[list[int]]:
        mailbox = StreamMailbox(asyncio.get_running_loop())
        chunks = []
        mailbox.put(output(0))
        async for out in read_stream(mailbox, lambda finished: None):
            chunks.append(out.token_ids)
            if out.token_ids == [0]:
                for token in range(1, 5):  # while the reader handles its chunk
                    mailbox.put(output(token, finished=token == 4))
        return chunks

    assert asyncio.run(read()) == [[0], [1, 2, 3, 4]]


def test_an_error_after_outputs_is_raised_after_them() -> None:
    async def read() -> tuple[list[list[int]], BaseException | None]:
        mailbox = StreamMailbox(asyncio.get_running_loop())
        for item in (output(1), output(2), RuntimeError("engine error: boom")):
            mailbox.put(item)
        chunks = []
        try:
            async for out in read_stream(mailbox, lambda finished: None):
                chunks.append(out.token_ids)
        except RuntimeError as exc:
            return chunks, exc
        return chunks, None

    chunks, error = asyncio.run(read())
    assert chunks == [[1, 2]] and str(error) == "engine error: boom"


def count_wakeups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the reader's wake-ups: each waiter the mailbox settles (a put from another
    thread, or the stall timer)."""
    calls = [0]
    settle = stream_mailbox._settle

    def counted(waiter: asyncio.Future[None]) -> None:
        calls[0] += not waiter.done()
        settle(waiter)

    monkeypatch.setattr(stream_mailbox, "_settle", counted)
    return calls


@pytest.mark.parametrize(("interval_s", "gap_s", "count"), [(0.0, 0.001, 200), (0.05, 0.001, 200), (0.01, 0.02, 15)],
                         ids=["unpaced", "paced, faster than the interval", "paced, slower than the interval"])
def test_the_reader_is_woken_once_per_chunk(monkeypatch: pytest.MonkeyPatch, interval_s: float, gap_s: float,
                                            count: int) -> None:
    """The engine thread puts ``count`` outputs ``gap_s`` apart; the reader's loop is woken
    at most once per chunk it reads: a paced reader not by a timer of its own, and not by
    outputs that come before it is due."""
    wakeups = count_wakeups(monkeypatch)

    async def read() -> tuple[list[RequestOutput], float]:
        mailbox = StreamMailbox(asyncio.get_running_loop())
        spent = [0.0]

        def produce() -> None:
            start = time.monotonic()
            for token in range(count):
                time.sleep(gap_s)
                mailbox.put(output(token, finished=token == count - 1))
            spent[0] = time.monotonic() - start

        producer = threading.Thread(target=produce)
        producer.start()
        chunks = []
        async for out in read_stream(mailbox, lambda finished: None, interval_s):
            chunks.append(out)
            time.sleep(0.002)  # the reader's work on a chunk (framing, writing), as a server's
        producer.join()
        return chunks, spent[0]

    chunks, spent = asyncio.run(read())
    assert [t for out in chunks for t in out.token_ids] == list(range(count)), "nothing lost or reordered"
    # +2: a producer stalled past the stall timer (a loaded machine) may cost a wake-up that finds nothing
    assert wakeups[0] <= len(chunks) + 2, f"{wakeups[0]} wake-ups for {len(chunks)} chunks"
    if interval_s and gap_s < interval_s:
        assert len(chunks) <= spent / interval_s + 2, "a chunk at most once per interval"


def test_a_reader_that_leaves_while_waiting_is_closed_unfinished() -> None:
    async def read() -> list[bool]:
        loop = asyncio.get_running_loop()
        mailbox = StreamMailbox(loop)
        closed: list[bool] = []
        mailbox.put(output(0))

        async def consume() -> None:
            async for _ in read_stream(mailbox, closed.append, 0.5):
                pass

        reader = asyncio.ensure_future(consume())
        await asyncio.sleep(0.05)  # it has the first output and waits, not due, for more
        mailbox.put(output(1))  # early: no wake-up
        reader.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await reader
        mailbox.put(output(2, finished=True))  # the engine's end still comes: nobody waits for it
        await asyncio.sleep(0)
        return closed

    assert asyncio.run(read()) == [False]


def test_a_put_after_the_readers_loop_closed_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    mailbox = StreamMailbox(loop)
    reader = mailbox.take()
    waiter = reader.send(None)  # the reader waits on its future
    loop.close()  # the server's loop is gone
    mailbox.put(output(1, finished=True))  # the engine thread's end: dropped, not raised
    assert not waiter.done()
    reader.close()


def test_an_early_output_left_alone_is_taken_by_the_stall_timer() -> None:
    """A paced stream whose ticks stall: the output put before the reader was due goes out
    ``STALL_S`` after it was due, not with the end half a second later."""
    schedule = [(0.0, output(0)), (0.01, output(1)), (0.6, output(2, finished=True))]
    got, _ = asyncio.run(read_timed(0.05, schedule))
    assert [out.token_ids for _, out in got] == [[0], [1], [2]]
    assert 0.05 + stream_mailbox.STALL_S - 0.01 <= got[1][0] < 0.45


def test_the_interval_grows_past_the_streams_it_paces() -> None:
    paced = StreamPacing(interval_ms=20, pace_streams=4)
    assert stream_mailbox.paced_interval_s(paced, 1) == 0.02
    assert stream_mailbox.paced_interval_s(paced, 4) == 0.02
    assert stream_mailbox.paced_interval_s(paced, 16) == pytest.approx(0.08), "16 streams send what 4 would"
    assert stream_mailbox.paced_interval_s(StreamPacing(interval_ms=20), 16) == 0.02, "0: never grows"
    assert stream_mailbox.paced_interval_s(StreamPacing(pace_streams=4), 16) == 0.0, "unpaced stays unpaced"
    with pytest.raises(ValueError, match="--stream-pace-streams must be >= 0"):
        StreamPacing(pace_streams=-1)


def test_an_interval_function_is_read_after_each_chunk() -> None:
    """The server passes its pacing as a function of the streams open now: a stream paced
    while many are open sends fewer chunks, and speeds up again when they leave."""
    readings: list[float] = []

    def interval() -> float:
        readings.append(0.15 if len(readings) < 3 else 0.0)  # many streams open, then few
        return readings[-1]

    async def read() -> list[RequestOutput]:
        mailbox = StreamMailbox(asyncio.get_running_loop())

        async def feed() -> None:
            for i in range(150):
                await asyncio.sleep(0.005)
                mailbox.put(output(i, finished=i == 149))

        feeder = asyncio.ensure_future(feed())
        got = [out async for out in read_stream(mailbox, lambda finished: None, interval)]
        await feeder
        return got

    got = asyncio.run(read())
    assert [t for out in got for t in out.token_ids] == list(range(150))
    paced = [len(out.token_ids) for out in got[1:4]]
    assert all(n >= 10 for n in paced), f"~0.15 s of 5 ms outputs per chunk while paced: {paced}"
    assert len(got) > 4 + 8, "a chunk per output the reader waits for once the interval drops to 0"
