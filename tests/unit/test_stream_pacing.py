"""``read_stream``'s pacing (``speclane serve --stream-interval-ms``): outputs that come
within the interval join the next chunk; the first and the final one are never held back."""

from __future__ import annotations

import asyncio
import time

import pytest

from speclane.engine.async_engine import read_stream
from speclane.engine.engine import RequestOutput
from speclane.request import TokenLogprob


def output(token: int, *, finished: bool = False, logprobs: bool = False) -> RequestOutput:
    return RequestOutput("r", f"<{token}>", [token], finished, "stop" if finished else None, 5, token,
                         speculative={"rounds": token},
                         logprobs=[TokenLogprob(token, -float(token), ())] if logprobs else None)


async def read_timed(interval_s: float, schedule: list[tuple[float, RequestOutput | BaseException]]
                     ) -> tuple[list[tuple[float, RequestOutput]], list[bool]]:
    """Put each item after its delay (seconds after the start); read the stream; return
    each yielded output with the seconds since the start, and what ``closed`` was told."""
    queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
    closed: list[bool] = []
    start = time.monotonic()

    async def feed() -> None:
        for delay, item in schedule:
            await asyncio.sleep(max(0.0, start + delay - time.monotonic()))
            queue.put_nowait(item)

    feeder = asyncio.ensure_future(feed())
    got = []
    try:
        async for out in read_stream(queue, closed.append, interval_s):
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


def test_no_interval_yields_every_output() -> None:
    schedule = [(0.0, output(i, finished=i == 9)) for i in range(10)]
    got, _ = asyncio.run(read_timed(0.0, schedule))
    assert [out.token_ids for _, out in got] == [[i] for i in range(10)]


def test_an_error_while_waiting_is_raised() -> None:
    schedule = [(0.0, output(1)), (0.01, output(2)), (0.02, RuntimeError("engine error: boom"))]
    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(read_timed(0.5, schedule))


def test_then_keeps_logprobs_absent_when_neither_has_them() -> None:
    joined = output(1).then(output(2))
    assert joined.logprobs is None and joined.token_ids == [1, 2] and joined.text == "<1><2>"
