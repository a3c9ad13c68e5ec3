"""Soak: 150 requests from 20 concurrent clients, a quarter of them cancelled at random
points: streams after a random number of events (0: as soon as the headers arrive),
everything after a random time (while queued, prefilling, decoding, or racing the end).

Every request ends as exactly one of: a complete, well-formed answer; a cancellation we
caused; or a clean error in OpenAI's shape (4xx/503). None is lost or hangs. Afterwards
the engine is idle — KV pool full, lane empty, no stream, no live request, no per-request
state left in the engine — and the process grew by less than ``MAX_RSS_GROWTH_MB``
between a warm-up round and the end (the bound covers allocator noise and the
prometheus histograms; a leak of per-request state — ~100 KB of KV bookkeeping, queues,
detokenizers — would show up as structures left non-empty rather than as RSS).
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
import psutil
import pytest
from server_helpers import MODEL, LiveServer, engine_idle, wait_until

from speclane.engine.async_engine import AsyncEngine

pytestmark = pytest.mark.slow

NUM_REQUESTS = 150
NUM_CLIENTS = 20
CANCEL_EVERY = 4  # a quarter
REQUEST_TIMEOUT_S = 180.0  # a request slower than this counts as a hang
MAX_RSS_GROWTH_MB = 64
TOPICS = ["the sea", "a cat", "music", "rain", "bread", "mountains", "a clock", "the moon"]


@dataclass(frozen=True)
class Plan:
    index: int
    chat: bool
    stream: bool
    max_tokens: int
    cancel: bool
    cancel_after_events: int  # streams: hang up after this many events (0: right after the headers)
    cancel_after_s: float  # plain requests, and streams that are slower: hang up after this long
    body: dict[str, Any]


def make_plans(seed: int = 1234) -> list[Plan]:
    rng = random.Random(seed)
    plans = []
    for i in range(NUM_REQUESTS):
        chat, stream = rng.random() < 0.7, rng.random() < 0.6
        max_tokens = rng.randint(1, 6)
        topic = rng.choice(TOPICS)
        body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "stream": stream,
                                "temperature": rng.choice([0, 0.7]), "priority": rng.randint(-1, 2),
                                "speculative": rng.random() < 0.8, "user": f"soak-{i % 5}"}
        if chat:
            body["messages"] = [{"role": "user", "content": f"One sentence about {topic}."}]
        else:
            body["prompt"] = f"A short note about {topic}:"
        if stream and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        plans.append(Plan(i, chat, stream, max_tokens, cancel=i % CANCEL_EVERY == 0,
                          cancel_after_events=rng.randint(0, 1 + max_tokens), cancel_after_s=rng.uniform(0.0, 6.0),
                          body=body))
    return plans


async def _stream(client: httpx.AsyncClient, path: str, plan: Plan) -> str:
    async with client.stream("POST", path, json=plan.body) as response:
        if response.status_code != 200:
            return _error_outcome(response.status_code, json.loads(await response.aread()))
        events = []
        if plan.cancel and plan.cancel_after_events == 0:
            return "cancelled"
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
                if plan.cancel and len(events) == plan.cancel_after_events and events[-1] != "[DONE]":
                    return "cancelled mid-stream"  # leaving the block closes the connection
    assert events and events[-1] == "[DONE]", f"request {plan.index}: the stream did not end with [DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), f"request {plan.index}: error event {chunks}"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes in (["stop"], ["length"]), f"request {plan.index}: finish reasons {finishes}"
    if "stream_options" in plan.body:
        assert chunks[-1]["usage"]["completion_tokens"] <= plan.max_tokens
    return "complete"


async def _plain(client: httpx.AsyncClient, path: str, plan: Plan) -> str:
    response = await client.post(path, json=plan.body)
    body = response.json()
    if response.status_code != 200:
        return _error_outcome(response.status_code, body)
    assert body["choices"][0]["finish_reason"] in ("stop", "length"), body
    assert body["usage"]["completion_tokens"] <= plan.max_tokens
    return "complete"


def _error_outcome(status: int, body: dict[str, Any]) -> str:
    assert status < 500 or status == 503, f"server error {status}: {body}"
    assert set(body.get("error", {})) == {"message", "type", "param", "code"}, body
    return f"error {status}"


async def run_one(client: httpx.AsyncClient, plan: Plan) -> str:
    path = "/v1/chat/completions" if plan.chat else "/v1/completions"
    work = (_stream if plan.stream else _plain)(client, path, plan)
    if not plan.cancel:
        return await asyncio.wait_for(work, REQUEST_TIMEOUT_S)
    try:
        return await asyncio.wait_for(work, plan.cancel_after_s)
    except TimeoutError:
        return "cancelled"


async def run_soak(url: str, plans: list[Plan]) -> dict[int, str]:
    queue: asyncio.Queue[Plan] = asyncio.Queue()
    for plan in plans:
        queue.put_nowait(plan)
    outcomes: dict[int, str] = {}

    async def worker() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
            while not queue.empty():
                plan = queue.get_nowait()
                try:
                    outcomes[plan.index] = await run_one(client, plan)
                except TimeoutError:
                    outcomes[plan.index] = "hung"
                except AssertionError as exc:
                    outcomes[plan.index] = f"bad: {exc}"

    await asyncio.gather(*(worker() for _ in range(NUM_CLIENTS)))
    return outcomes


def engine_leftovers(async_engine: AsyncEngine, tracker) -> dict[str, int]:
    """Per-request state still held anywhere (all must be 0)."""
    engine = async_engine.engine
    return {
        "live requests (server)": tracker.num_live,
        "open streams (async engine)": async_engine.num_streams,
        "running": engine.scheduler.num_running,
        "waiting": engine.scheduler.num_waiting,
        "KV block tables held": engine.scheduler.kv.num_holders,
        "lane members": engine.scheduler.lane.num_holders + engine.scheduler.lane.num_waiters,
        "detokenizers": len(engine._detoks),
        "token clocks": len(engine._last_token_s),
        "sampling streams (runner)": engine.runner.num_sampling_streams,
    }


def test_soak(live: LiveServer, async_engine: AsyncEngine) -> None:
    process = psutil.Process()
    warmup = [p for p in make_plans(seed=99)[:20]]
    asyncio.run(run_soak(live.url, warmup))
    wait_until(lambda: engine_idle(async_engine), timeout=120, what="idle after the warm-up")
    gc.collect()
    rss_before = process.memory_info().rss

    plans = make_plans()
    started = time.monotonic()
    outcomes = asyncio.run(run_soak(live.url, plans))
    elapsed = time.monotonic() - started

    assert sorted(outcomes) == list(range(NUM_REQUESTS)), "a request was lost"
    kinds = Counter(o if not o.startswith("bad") else "bad" for o in outcomes.values())
    cancelled = kinds["cancelled"] + kinds["cancelled mid-stream"]
    bad = {i: o for i, o in outcomes.items() if o.startswith("bad") or o == "hung"}
    assert not bad, f"{len(bad)} requests failed: {dict(list(bad.items())[:5])}"
    planned_cancels = sum(p.cancel for p in plans)
    assert cancelled <= planned_cancels
    assert kinds["complete"] >= NUM_REQUESTS - planned_cancels, kinds

    wait_until(lambda: engine_idle(async_engine) and live.tracker.num_live == 0, timeout=120,
               what="the engine to be idle after the soak")
    leftovers = engine_leftovers(async_engine, live.tracker)
    assert not any(leftovers.values()), leftovers
    assert async_engine.engine.scheduler.kv.num_holders == 0

    metrics = httpx.get(live.url + "/metrics").text
    assert "speclane_requests_running 0.0" in metrics
    assert httpx.get(live.url + "/health").status_code == 200

    gc.collect()
    growth_mb = (process.memory_info().rss - rss_before) / 2**20
    print(f"\nsoak: {NUM_REQUESTS} requests in {elapsed:.1f} s, outcomes {dict(kinds)}, "
          f"RSS growth {growth_mb:.1f} MB")
    assert growth_mb < MAX_RSS_GROWTH_MB
