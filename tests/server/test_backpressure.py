"""Queue full is 429 with ``Retry-After`` (the engine's own ``QueueFullError``), and the
refused request leaves nothing behind."""

from __future__ import annotations

import dataclasses

import httpx
import openai
import pytest
from server_helpers import MODEL, LiveServer, engine_idle, wait_until

from speclane.engine.async_engine import AsyncEngine

pytestmark = pytest.mark.slow


@pytest.fixture
def full_queue(async_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--max-queue 0``: every new request finds the waiting queue full."""
    scheduler = async_engine.engine.scheduler
    monkeypatch.setattr(scheduler, "config", dataclasses.replace(scheduler.config, max_queue=0))


def test_queue_full_is_429_with_retry_after(live: LiveServer, async_engine: AsyncEngine, full_queue: None) -> None:
    for stream in (False, True):
        response = httpx.post(live.url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": stream})
        assert response.status_code == 429, response.text
        assert int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"
        assert "retry" in error["message"]
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert engine_idle(async_engine) and live.tracker.num_live == 0


def test_more_choices_than_the_queue_holds_is_a_400_not_a_429(live: LiveServer, async_engine: AsyncEngine,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Each choice waits in the queue: n above --max-queue could never be admitted, and a 429
    would send the client's retries round for ever."""
    monkeypatch.setattr(live.app.state.server, "max_queue", 4)
    for stream in (False, True):
        response = httpx.post(live.url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 5, "stream": stream})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "n" and "--max-queue" in error["message"] and "at most 4" in error["message"]
    ok = httpx.post(live.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 4})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 4
    # (the server is shared: other modules' requests may still be ending)
    wait_until(lambda: engine_idle(async_engine) and live.tracker.num_live == 0, timeout=60, what="an idle engine")
