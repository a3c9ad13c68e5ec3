"""``read_stream`` and its mailbox: outputs put while the reader is busy come as one; the
pacing of ``speclane serve --stream-interval-ms`` (outputs that come within the interval
join the next chunk; the first and the final one are never held back); and the wake-ups of
the reader's loop: at most one per take, none for an output a paced reader is not due for."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

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
    schedule = [(0.01 * i, output(i, finished=i == 9)) for i in range(10)]
    got, _ = asyncio.run(read_timed(0.0, schedule))
    assert [out.token_ids for _, out in got] == [[i] for i in range(10)]


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


def count_wakeups(loop: asyncio.AbstractEventLoop) -> list[int]:
    """Count the calls other threads make into ``loop`` (each one wakes it)."""
    calls = [0]
    call_soon_threadsafe = loop.call_soon_threadsafe

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return call_soon_threadsafe(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("interval_s", [0.0, 0.05])
def test_a_fast_producer_wakes_the_reader_at_most_once_per_chunk(interval_s: float) -> None:
    """The engine thread puts 200 outputs ~1 ms apart; the reader's loop is woken at most once
    per chunk it reads (paced: only for the final output, the interval's timer does the rest)."""
    async def read() -> tuple[list[RequestOutput], int]:
        loop = asyncio.get_running_loop()
        calls = count_wakeups(loop)
        mailbox = StreamMailbox(loop)

        def produce() -> None:
            for token in range(200):
                time.sleep(0.001)
                mailbox.put(output(token, finished=token == 199))

        producer = threading.Thread(target=produce)
        producer.start()
        chunks = []
        async for out in read_stream(mailbox, lambda finished: None, interval_s):
            chunks.append(out)
            time.sleep(0.002)  # the reader's work on a chunk (framing, writing), as a server's
        producer.join()
        return chunks, calls[0]

    chunks, wakeups = asyncio.run(read())
    assert [t for out in chunks for t in out.token_ids] == list(range(200)), "nothing lost or reordered"
    assert wakeups <= len(chunks)
    if interval_s:
        assert wakeups <= 2, "a paced reader is woken by its timer, and by the final output only"
        assert len(chunks) < 20
    else:
        assert len(chunks) < 150, "outputs put while the reader worked on a chunk joined the next one"


def test_an_error_while_waiting_is_raised() -> None:
    schedule = [(0.0, output(1)), (0.01, output(2)), (0.02, RuntimeError("engine error: boom"))]
    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(read_timed(0.5, schedule))


def test_then_keeps_logprobs_absent_when_neither_has_them() -> None:
    joined = output(1).then(output(2))
    assert joined.logprobs is None and joined.token_ids == [1, 2] and joined.text == "<1><2>"
